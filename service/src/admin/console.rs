//! `GET /admin/console`: the operators' web page (`console.html`, compiled in): per policy the
//! requests allowed and refused, the keys refused most, and the overrides. It is one static file
//! that holds no data, so it is served without a token; everything it shows it reads from
//! `/admin/v1/top` and `/admin/v1/overrides` with the token the operator gives it (in the
//! page's `#token=` fragment, which no request carries, or its form), kept in the tab's
//! `sessionStorage`. No build step, no script or style from elsewhere (its content security
//! policy allows none), every value put in as text.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{
    HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use hyper::{Response, StatusCode};

use crate::web::Reply;

/// Where the page is.
pub const PATH: &str = "/admin/console";

const PAGE: &str = include_str!("console.html");

/// Its inline script and style only, its requests to this origin only, in no frame.
const POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                      connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

pub fn page() -> Reply {
    let mut response = Response::new(Full::new(Bytes::from_static(PAGE.as_bytes())));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    let html = HeaderValue::from_static("text/html; charset=utf-8");
    headers.insert(CONTENT_TYPE, html);
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_writes_no_markup_from_data() {
        assert!(!PAGE.contains("http://") && !PAGE.contains("https://"));
        assert!(!PAGE.contains("<script src") && !PAGE.contains("<link"));
        assert!(!PAGE.contains("innerHTML") && !PAGE.contains("outerHTML"));
        assert!(PAGE.contains("/admin/v1/top"));
        assert_eq!(page().headers()[CONTENT_SECURITY_POLICY], POLICY);
    }
}
