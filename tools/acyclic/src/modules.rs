//! Reads a crate's modules from its root file: where each is, and every path it names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;
use syn::{Attribute, Item, UseTree};

/// A module path from the crate root: `["limiter", "global"]`.
pub type ModPath = Vec<String>;

/// A path one module names, made absolute: what it points at, and where it was written.
pub struct Reference {
    pub from: ModPath,
    pub to: ModPath,
    pub file: PathBuf,
    pub text: String,
}

/// Every module of one crate, and every path its code names into the crate.
pub struct Crate {
    pub modules: BTreeSet<ModPath>,
    pub references: Vec<Reference>,
}

/// Reads the crate whose root file is `root`, following its `mod` declarations.
pub fn read(root: &Path) -> Result<Crate, String> {
    let mut found = Crate {
        modules: BTreeSet::new(),
        references: Vec::new(),
    };
    let mut pending = vec![(root.to_path_buf(), ModPath::new())];
    while let Some((file, module)) = pending.pop() {
        let text = std::fs::read_to_string(&file)
            .map_err(|error| format!("{}: {error}", file.display()))?;
        let syntax =
            syn::parse_file(&text).map_err(|error| format!("{}: {error}", file.display()))?;
        let mut reader = FileReader {
            file: &file,
            scope: vec![Scope::of(module.clone(), &syntax.items)],
            children: Vec::new(),
            crate_: &mut found,
        };
        reader.crate_.modules.insert(module.clone());
        reader.visit_file(&syntax);
        for (inline, name) in reader.children {
            let dir = children_dir(&file, &inline[module.len()..]);
            let mut child = inline;
            child.push(name.clone());
            pending.push((module_file(&dir, &name)?, child));
        }
    }
    Ok(found)
}

/// The directory that holds the files of modules declared in `file` (inside its inline modules
/// `inline`).
fn children_dir(file: &Path, inline: &[String]) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new("."));
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let mut dir = match stem {
        "lib" | "main" | "mod" => parent.to_path_buf(),
        _ => parent.join(stem),
    };
    dir.extend(inline);
    dir
}

fn module_file(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let flat = dir.join(format!("{name}.rs"));
    let nested = dir.join(name).join("mod.rs");
    [flat.clone(), nested]
        .into_iter()
        .find(|path| path.exists())
        .ok_or_else(|| format!("module {name}: no {}", flat.display()))
}

/// True for code that exists only in tests: `#[cfg(test)]`, `#[cfg(any(test, ...))]`.
fn test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let words = quote_free(attr);
        attr.path().is_ident("cfg")
            && words.contains(&"test".to_string())
            && !words.contains(&"not".to_string())
    })
}

/// The identifiers inside an attribute's arguments.
fn quote_free(attr: &Attribute) -> Vec<String> {
    let mut words = Vec::new();
    let _ = attr.parse_nested_meta(|meta| {
        collect_words(&meta, &mut words);
        Ok(())
    });
    words
}

fn collect_words(meta: &syn::meta::ParseNestedMeta, words: &mut Vec<String>) {
    if let Some(ident) = meta.path.get_ident() {
        words.push(ident.to_string());
    }
    if meta.input.peek(syn::token::Paren) {
        let _ = meta.parse_nested_meta(|inner| {
            collect_words(&inner, words);
            Ok(())
        });
    } else if meta.input.peek(syn::Token![=]) {
        let _ = meta.value().and_then(|value| value.parse::<syn::Lit>());
    }
}

/// A module being read: its path and the names of the modules it declares.
struct Scope {
    path: ModPath,
    children: BTreeSet<String>,
}

impl Scope {
    fn of(path: ModPath, items: &[Item]) -> Scope {
        let children = items
            .iter()
            .filter_map(|item| match item {
                Item::Mod(module) if !test_only(&module.attrs) => Some(module.ident.to_string()),
                _ => None,
            })
            .collect();
        Scope { path, children }
    }
}

struct FileReader<'a> {
    file: &'a Path,
    scope: Vec<Scope>,
    /// Modules declared here whose code is in another file: (the inline module they are in, name).
    children: Vec<(ModPath, String)>,
    crate_: &'a mut Crate,
}

impl FileReader<'_> {
    /// Records `segments` if it points into this crate.
    fn name(&mut self, segments: Vec<String>) {
        let Some(scope) = self.scope.last() else {
            return;
        };
        let here = &scope.path;
        let Some(first) = segments.first() else {
            return;
        };
        let to = match first.as_str() {
            "crate" => segments[1..].to_vec(),
            "self" => [here.as_slice(), &segments[1..]].concat(),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let Some(kept) = here.len().checked_sub(ups) else {
                    return;
                };
                [&here[..kept], &segments[ups..]].concat()
            }
            child if scope.children.contains(child) => [here.as_slice(), &segments].concat(),
            _ => return,
        };
        let text = segments.join("::");
        self.crate_.references.push(Reference {
            from: here.clone(),
            to,
            file: self.file.to_path_buf(),
            text,
        });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &UseTree) {
        match tree {
            UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            UseTree::Name(name) if name.ident == "self" => self.name(prefix.clone()),
            UseTree::Name(name) => {
                self.name([prefix.as_slice(), &[name.ident.to_string()]].concat())
            }
            UseTree::Rename(rename) => {
                self.name([prefix.as_slice(), &[rename.ident.to_string()]].concat())
            }
            UseTree::Glob(_) => self.name(prefix.clone()),
            UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for FileReader<'_> {
    fn visit_item(&mut self, item: &'ast Item) {
        let attrs = match item {
            Item::Fn(f) => &f.attrs,
            Item::Impl(i) => &i.attrs,
            Item::Mod(m) => &m.attrs,
            Item::Use(u) => &u.attrs,
            Item::Struct(s) => &s.attrs,
            Item::Enum(e) => &e.attrs,
            Item::Const(c) => &c.attrs,
            Item::Static(s) => &s.attrs,
            Item::Trait(t) => &t.attrs,
            Item::Type(t) => &t.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        let name = module.ident.to_string();
        let Some(here) = self.scope.last().map(|scope| scope.path.clone()) else {
            return;
        };
        match &module.content {
            None => self.children.push((here, name)),
            Some((_, items)) => {
                let mut path = here;
                path.push(name);
                self.crate_.modules.insert(path.clone());
                self.scope.push(Scope::of(path, items));
                for item in items {
                    self.visit_item(item);
                }
                self.scope.pop();
            }
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            self.name(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }
}
