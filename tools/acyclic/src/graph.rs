//! The circles among sibling modules, from the references between them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use crate::modules::{Crate, ModPath, Reference};

/// Each circle as text: the parent it is in, and one reference for each edge of the circle.
pub fn circles(crate_: &Crate) -> Vec<String> {
    // Under each parent, the edges between its children, with the first reference seen.
    let mut levels: BTreeMap<ModPath, BTreeMap<(String, String), &Reference>> = BTreeMap::new();
    for reference in &crate_.references {
        let to = landing(&crate_.modules, &reference.to);
        let common = reference
            .from
            .iter()
            .zip(to)
            .take_while(|(a, b)| a == b)
            .count();
        let (Some(from_child), Some(to_child)) = (reference.from.get(common), to.get(common))
        else {
            continue; // a module and its own parent or child
        };
        let parent = reference.from[..common].to_vec();
        levels
            .entry(parent)
            .or_default()
            .entry((from_child.clone(), to_child.clone()))
            .or_insert(reference);
    }
    let mut found = Vec::new();
    for (parent, edges) in &levels {
        for component in strongly_connected(edges.keys()) {
            let mut text = String::new();
            let place = if parent.is_empty() {
                "the crate root".into()
            } else {
                parent.join("::")
            };
            let _ = writeln!(
                text,
                "  in {place}: {}",
                component.iter().cloned().collect::<Vec<_>>().join(", ")
            );
            for ((a, b), reference) in edges {
                if component.contains(a) && component.contains(b) {
                    let _ = writeln!(
                        text,
                        "    {a} -> {b}: {} names {}",
                        reference.file.display(),
                        reference.text
                    );
                }
            }
            found.push(text);
        }
    }
    found
}

/// The longest known module that `path` starts with: where a named item lives.
fn landing<'a>(modules: &BTreeSet<ModPath>, path: &'a [String]) -> &'a [String] {
    (0..=path.len())
        .rev()
        .map(|len| &path[..len])
        .find(|prefix| modules.contains(*prefix))
        .unwrap_or(&[])
}

/// The groups of two or more nodes that reach each other (Tarjan's algorithm).
fn strongly_connected<'a>(
    edges: impl Iterator<Item = &'a (String, String)>,
) -> Vec<BTreeSet<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    let mut state = Tarjan {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        groups: Vec::new(),
    };
    for node in next.keys() {
        if !state.index.contains_key(node) {
            state.visit(node);
        }
    }
    state.groups
}

struct Tarjan<'a> {
    next: &'a BTreeMap<&'a str, Vec<&'a str>>,
    index: BTreeMap<&'a str, usize>,
    low: BTreeMap<&'a str, usize>,
    stack: Vec<&'a str>,
    groups: Vec<BTreeSet<String>>,
}

impl<'a> Tarjan<'a> {
    fn visit(&mut self, node: &'a str) {
        let index = self.index.len();
        self.index.insert(node, index);
        self.low.insert(node, index);
        self.stack.push(node);
        for &to in self.next.get(node).into_iter().flatten() {
            if !self.index.contains_key(to) {
                self.visit(to);
                let low = self.low[node].min(self.low[to]);
                self.low.insert(node, low);
            } else if self.stack.contains(&to) {
                let low = self.low[node].min(self.index[to]);
                self.low.insert(node, low);
            }
        }
        if self.low[node] == index {
            let mut group = BTreeSet::new();
            while let Some(member) = self.stack.pop() {
                group.insert(member.to_string());
                if member == node {
                    break;
                }
            }
            if group.len() > 1 {
                self.groups.push(group);
            }
        }
    }
}
