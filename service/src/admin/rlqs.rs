//! `GET /admin/v1/rlqs` (read): the RLQS as this replica serves it, the figures of its
//! `sluice_service_rlqs_*` series by domain and descriptor of the limits (never a bucket's
//! value): the streams open, and per descriptor the bucket reports entered, the requests they
//! reported allowed and denied, the requests per period assigned now and the Envoys holding
//! a share. Each replica answers for its own streams. Without `--rlqs`, 404.

use hyper::StatusCode;

use super::{Admin, Route};
use crate::web::{error, json, Reply};

pub const ROUTES: [Route; 1] = [Route {
    method: hyper::Method::GET,
    path: "/admin/v1/rlqs",
    action: "rlqs.show",
    writes: false,
}];

pub fn serve<S>(admin: &Admin<S>) -> Reply {
    match &admin.rlqs {
        Some(metrics) => json(StatusCode::OK, &metrics.view()),
        None => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this replica serves no RLQS (--rlqs)",
        ),
    }
}
