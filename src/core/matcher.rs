//! Which requests a policy applies to.

use crate::core::request::{Attributes, RequestSource};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRule {
    Prefix(String),
    Exact(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderRule {
    Present(bool),
    Equals(Vec<u8>),
}

/// All conditions must hold; an empty matcher matches every request. Attribute indices point
/// into the plan's attribute list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    pub path: Option<(usize, PathRule)>,
    pub methods: Option<(usize, Vec<String>)>,
    pub headers: Vec<(usize, HeaderRule)>,
    /// Names of the routes (as Envoy selected them) the policy applies on.
    pub routes: Option<(usize, Vec<String>)>,
}

impl Matcher {
    pub fn matches<S: RequestSource + ?Sized>(&self, request: &mut Attributes<S>) -> bool {
        if let Some((attr, rule)) = &self.path {
            let path = request.get(*attr).unwrap_or_default();
            let hit = match rule {
                PathRule::Prefix(prefix) => path.starts_with(prefix.as_bytes()),
                PathRule::Exact(exact) => path == exact.as_bytes(),
            };
            if !hit {
                return false;
            }
        }
        for (attr, names) in [&self.methods, &self.routes].into_iter().flatten() {
            let value = request.get(*attr).unwrap_or_default();
            if !names.iter().any(|name| name.as_bytes() == value) {
                return false;
            }
        }
        self.headers.iter().all(|(attr, rule)| {
            let value = request.get(*attr);
            match rule {
                HeaderRule::Present(wanted) => value.is_some() == *wanted,
                HeaderRule::Equals(expected) => value == Some(expected.as_slice()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::request::Attr;
    use crate::testing::FakeRequest;

    const ATTRS: [Attr; 4] = [Attr::Path, Attr::Method, Attr::Authority, Attr::Route];

    fn check(matcher: &Matcher, headers: &[(&str, &str)]) -> bool {
        matcher.matches(&mut Attributes::new(&FakeRequest::new(headers), &ATTRS))
    }

    fn prefix(p: &str) -> Matcher {
        Matcher {
            path: Some((0, PathRule::Prefix(p.into()))),
            ..Matcher::default()
        }
    }

    #[test]
    fn an_empty_matcher_matches_everything() {
        assert!(check(&Matcher::default(), &[]));
    }

    #[test]
    fn prefix_ignores_the_query_string() {
        assert!(check(&prefix("/api/"), &[(":path", "/api/users?x=1")]));
        assert!(!check(&prefix("/api/"), &[(":path", "/apix")]));
        assert!(!check(&prefix("/api/"), &[(":path", "/?p=/api/")]));
        assert!(!check(&prefix("/api/"), &[]));
    }

    #[test]
    fn exact_path_ignores_the_query_string() {
        let m = Matcher {
            path: Some((0, PathRule::Exact("/login".into()))),
            ..Matcher::default()
        };
        assert!(check(&m, &[(":path", "/login?next=/")]));
        assert!(!check(&m, &[(":path", "/login/")]));
    }

    #[test]
    fn methods_must_be_listed() {
        let m = Matcher {
            methods: Some((1, vec!["GET".into(), "POST".into()])),
            ..Matcher::default()
        };
        assert!(check(&m, &[(":method", "POST")]));
        assert!(!check(&m, &[(":method", "DELETE")]));
        assert!(!check(&m, &[(":method", "get")]));
    }

    #[test]
    fn routes_must_be_listed_by_the_name_envoy_selected() {
        let m = Matcher {
            routes: Some((3, vec!["checkout".into(), "search".into()])),
            ..Matcher::default()
        };
        let on = |route: &str| {
            let request = FakeRequest::default().with_property("xds.route_name", route);
            m.matches(&mut Attributes::new(&request, &ATTRS))
        };
        assert!(on("search"));
        assert!(!on("api"));
        assert!(!on(""), "a route without a name");
    }

    proptest::proptest! {
        /// Any bytes a client can put in a path, method or header: an answer, never a panic.
        #[test]
        fn odd_requests_never_panic(
            path in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..300),
            method in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..20),
        ) {
            let mut request = FakeRequest::default();
            request.headers.insert(":path".into(), path);
            request.headers.insert(":method".into(), method.clone());
            request.headers.insert(":authority".into(), method);
            let m = Matcher {
                path: Some((0, PathRule::Prefix("/api/".into()))),
                methods: Some((1, vec!["GET".into()])),
                headers: vec![(2, HeaderRule::Equals(b"x".to_vec()))],
                routes: Some((3, vec!["api".into()])),
            };
            let _ = m.matches(&mut Attributes::new(&request, &ATTRS));
        }
    }

    #[test]
    fn header_conditions_present_absent_and_equal() {
        let m = |rule| Matcher {
            headers: vec![(2, rule)],
            ..Matcher::default()
        };
        let host = [(":authority", "a.example")];
        assert!(check(&m(HeaderRule::Present(true)), &host));
        assert!(!check(&m(HeaderRule::Present(false)), &host));
        assert!(check(&m(HeaderRule::Present(false)), &[]));
        assert!(check(&m(HeaderRule::Equals(b"a.example".to_vec())), &host));
        assert!(!check(&m(HeaderRule::Equals(b"b.example".to_vec())), &host));
    }
}
