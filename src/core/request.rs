//! The request attributes that policies read, each fetched from the host at most once.

use smallvec::SmallVec;

/// Where a request attribute comes from. The plan lists each distinct one once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attr {
    /// A request header, by lower-case name.
    Header(String),
    /// The downstream address Envoy computed (honouring its XFF trust settings), without port.
    Ip,
    /// The path without query string or fragment.
    Path,
    Method,
    Authority,
    /// Envoy's route name.
    Route,
    /// The `sluice` entry of the selected route's `metadata.filter_metadata` (see `route`).
    RouteMetadata,
    /// A value an earlier filter put in the request's dynamic metadata (e.g. the `sub` claim
    /// from `jwt_authn`): trusted, unlike what the client sends.
    Metadata {
        namespace: String,
        path: Vec<String>,
    },
    /// What the JSON request body says, read from the whole of it (`usage::request`):
    /// only requests whose decision waits for their body have one.
    Body(BodyField),
}

impl Attr {
    /// The attribute as a policy's `key` writes it (`header:x-user-id`, `ip`, ...).
    pub fn name(&self) -> String {
        match self {
            Attr::Header(name) => format!("header:{name}"),
            Attr::Ip => "ip".into(),
            Attr::Path => "path".into(),
            Attr::Method => "method".into(),
            Attr::Authority => "authority".into(),
            Attr::Route => "route".into(),
            Attr::RouteMetadata => "route_metadata".into(),
            Attr::Metadata { namespace, path } => {
                format!("metadata:{namespace}:{}", path.join("."))
            }
            Attr::Body(BodyField::String(field)) => format!("body:{field}"),
            Attr::Body(BodyField::MaxOutputTokens) => "body:max_tokens".into(),
        }
    }
}

/// A field of the JSON request body.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BodyField {
    /// A top-level string field (`body:model`).
    String(String),
    /// The most output it asks for (`max_tokens`, `max_completion_tokens`, `max_output_tokens`),
    /// as a decimal number.
    MaxOutputTokens,
}

impl BodyField {
    /// The filter state that shows its value to the access log (`wasm.<name>`, see
    /// `access_log::body_states`): `sluice.body.<FIELD>` for a string field (whose name may be
    /// any top-level field's, `max_tokens` among them), `sluice.max_output_tokens` for the count.
    pub fn state_name(&self) -> String {
        match self {
            BodyField::String(name) => format!("sluice.body.{name}"),
            BodyField::MaxOutputTokens => "sluice.max_output_tokens".into(),
        }
    }
}

/// The largest request body the filter reads, whole, when a policy needs it: a larger one is
/// refused (413). Envoy's own buffer limit (`per_connection_buffer_limit_bytes`, 1 MiB by
/// default) refuses a body larger than it first.
pub const BODY_BYTES: usize = 16 * 1024 * 1024;

/// The host's view of one request: raw bytes, as Envoy holds them.
pub trait RequestSource {
    fn header(&self, name: &str) -> Option<Vec<u8>>;
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// A body field's value when the decision has no body to read it from: none in Envoy (a
    /// request decided without its body has none); what an access log recorded in a replay.
    fn body_field(&self, _field: &BodyField) -> Option<Vec<u8>> {
        None
    }
}

/// A request's attributes but its body's, read while the host still shows them: what a decision
/// made once the body has come reads instead (the headers have gone on by then).
#[derive(Debug, Default)]
pub struct Snapshot(SmallVec<[Option<Option<Vec<u8>>>; 4]>);

/// Lazily read, memoized attributes of one request, indexed like `Plan::attrs`.
pub struct Attributes<'a, S: ?Sized> {
    source: &'a S,
    attrs: &'a [Attr],
    /// The start of the request body, when the decision waited for it.
    body: Option<&'a [u8]>,
    /// Grown to an attribute's index when it is first read: a request that reads none (or
    /// only the first) sets up nothing for the rest.
    cache: SmallVec<[Option<Option<Vec<u8>>>; 4]>,
}

impl<'a, S: RequestSource + ?Sized> Attributes<'a, S> {
    pub fn new(source: &'a S, attrs: &'a [Attr]) -> Self {
        Attributes {
            source,
            attrs,
            body: None,
            cache: SmallVec::new(),
        }
    }

    /// The attributes of `snapshot`, with the request body for its `Attr::Body` fields.
    pub fn of_snapshot(
        source: &'a S,
        attrs: &'a [Attr],
        snapshot: Snapshot,
        body: &'a [u8],
    ) -> Self {
        Attributes {
            source,
            attrs,
            body: Some(body),
            cache: snapshot.0,
        }
    }

    /// Reads every attribute but the body's now.
    pub fn snapshot(mut self) -> Snapshot {
        for (i, attr) in self.attrs.iter().enumerate() {
            if !matches!(attr, Attr::Body(_)) {
                self.get(i);
            }
        }
        Snapshot(self.cache)
    }

    /// The attribute's value; absent and empty values are both `None`.
    pub fn get(&mut self, index: usize) -> Option<&[u8]> {
        let attr = self.attrs.get(index)?;
        if self.cache.len() <= index {
            self.cache.resize_with(index + 1, || None);
        }
        self.cache
            .get_mut(index)?
            .get_or_insert_with(|| fetch(self.source, self.body, attr).filter(|v| !v.is_empty()))
            .as_deref()
    }

    /// Gives attribute `index` (`Attr::Path`) the request's whole `:path`, read already for
    /// something else (the status and admin paths), so that it is not read again.
    pub fn seed_path(&mut self, index: usize, path: Vec<u8>) {
        if !matches!(self.attrs.get(index), Some(Attr::Path)) {
            return;
        }
        if self.cache.len() <= index {
            self.cache.resize_with(index + 1, || None);
        }
        if let Some(slot) = self.cache.get_mut(index) {
            *slot = Some(Some(strip_query(path)).filter(|v| !v.is_empty()));
        }
    }

    /// Whether the attribute has a value (read now if it was not yet).
    pub fn has(&mut self, index: usize) -> bool {
        self.get(index).is_some()
    }

    /// The value of an attribute read already (by `get` or `has`), without the `&mut` that
    /// reading needs: what a value found among others is lent as.
    pub fn read_already(&self, index: usize) -> Option<&[u8]> {
        self.cache.get(index)?.as_ref()?.as_deref()
    }

    /// What attribute `index` is.
    pub fn attr(&self, index: usize) -> Option<&Attr> {
        self.attrs.get(index)
    }
}

fn fetch<S: RequestSource + ?Sized>(
    source: &S,
    body: Option<&[u8]>,
    attr: &Attr,
) -> Option<Vec<u8>> {
    match attr {
        Attr::Body(field) => match body {
            Some(body) => read_body_field(body, field),
            None => source.body_field(field),
        },
        Attr::Header(name) => source.header(name),
        Attr::Ip => source.property(&["source", "address"]).map(strip_port),
        Attr::Path => source.header(":path").map(strip_query),
        Attr::Method => source.header(":method"),
        Attr::Authority => source.header(":authority"),
        Attr::Route => source.property(&["xds", "route_name"]),
        Attr::RouteMetadata => {
            source.property(&["xds", "route_metadata", "filter_metadata", "sluice"])
        }
        Attr::Metadata { namespace, path } => {
            let mut full = vec!["metadata", "filter_metadata", namespace.as_str()];
            full.extend(path.iter().map(String::as_str));
            source.property(&full)
        }
    }
}

fn read_body_field(body: &[u8], field: &BodyField) -> Option<Vec<u8>> {
    match field {
        BodyField::String(name) => {
            crate::core::usage::request::string_field(body, name).map(String::into_bytes)
        }
        BodyField::MaxOutputTokens => {
            let tokens = crate::core::usage::request::RequestFields::read(body).max_output_tokens?;
            Some(tokens.to_string().into_bytes())
        }
    }
}

/// `1.2.3.4:5678` → `1.2.3.4`, `[::1]:5678` → `::1`; anything else is kept whole.
fn strip_port(mut address: Vec<u8>) -> Vec<u8> {
    if address.first() == Some(&b'[') {
        if let Some(end) = address.iter().position(|&b| b == b']') {
            address.truncate(end);
            address.remove(0);
        }
    } else if address.iter().filter(|&&b| b == b':').count() == 1 {
        if let Some(colon) = address.iter().position(|&b| b == b':') {
            address.truncate(colon);
        }
    }
    address
}

fn strip_query(mut path: Vec<u8>) -> Vec<u8> {
    if let Some(end) = path.iter().position(|&b| b == b'?' || b == b'#') {
        path.truncate(end);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeRequest;

    #[test]
    fn each_attribute_is_read_once() {
        let request = FakeRequest::new(&[(":path", "/api/x?q=1")]);
        let attrs = [Attr::Path, Attr::Header("x-user-id".into())];
        let mut view = Attributes::new(&request, &attrs);
        assert_eq!(view.get(0), Some(&b"/api/x"[..]));
        assert_eq!(view.get(0), Some(&b"/api/x"[..]));
        assert_eq!(view.get(1), None);
        assert_eq!(view.get(1), None);
        assert_eq!(request.reads.get(), 2);
    }

    #[test]
    fn an_empty_value_counts_as_missing() {
        let request = FakeRequest::new(&[("x-user-id", "")]);
        let attrs = [Attr::Header("x-user-id".into())];
        assert_eq!(Attributes::new(&request, &attrs).get(0), None);
    }

    #[test]
    fn ip_loses_its_port() {
        assert_eq!(strip_port(b"10.1.2.3:4567".to_vec()), b"10.1.2.3");
        assert_eq!(strip_port(b"[2001:db8::1]:443".to_vec()), b"2001:db8::1");
        assert_eq!(strip_port(b"2001:db8::1".to_vec()), b"2001:db8::1");
        assert_eq!(strip_port(b"[".to_vec()), b"[");
        let request = FakeRequest::default().with_property("source.address", "127.0.0.1:999");
        assert_eq!(
            Attributes::new(&request, &[Attr::Ip]).get(0),
            Some(&b"127.0.0.1"[..])
        );
    }

    #[test]
    fn path_loses_query_and_fragment() {
        assert_eq!(strip_query(b"/a/b?c=d".to_vec()), b"/a/b");
        assert_eq!(strip_query(b"/a#x".to_vec()), b"/a");
        assert_eq!(strip_query(b"?".to_vec()), b"");
    }
}
