//! `GET /admin/v1/envoys` (read): the filter fleet as this replica sees it (`crate::fleet`):
//! every Envoy whose calls said who it is in the last hour, how long ago, its workers and the
//! settlements they dropped; how many called in the last minute.

use hyper::StatusCode;
use serde::Serialize;

use super::{Admin, Route};
use crate::fleet::{Envoy, MAX_ENVOYS, RECENT_S};
use crate::web::{json, Reply};

pub const ROUTES: [Route; 1] = [Route {
    method: hyper::Method::GET,
    path: "/admin/v1/envoys",
    action: "envoys.show",
    writes: false,
}];

#[derive(Serialize)]
struct Fleet {
    envoys: Vec<Envoy>,
    /// Envoys that said who they are within `RECENT_S`: those that called in the last minute.
    called_last_minute: usize,
    /// What every Envoy listed dropped.
    settlements_dropped: u64,
    max_envoys: usize,
    /// Announcements not kept: `max_envoys` were kept already.
    untracked: u64,
}

pub fn serve<S>(admin: &Admin<S>) -> Reply {
    let envoys = admin.fleet.envoys(admin.fleet.now_s());
    let fleet = Fleet {
        called_last_minute: envoys.iter().filter(|e| e.last_call_s <= RECENT_S).count(),
        settlements_dropped: envoys.iter().map(|e| e.settlements_dropped).sum(),
        envoys,
        max_envoys: MAX_ENVOYS,
        untracked: admin.fleet.untracked(),
    };
    json(StatusCode::OK, &fleet)
}
