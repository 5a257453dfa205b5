//! `sluice envoys`: the filter fleet as the replica asked sees it (`GET /admin/v1/envoys`): each
//! Envoy whose calls said who it is in the last hour, how long ago, its workers, and the
//! settlements they dropped.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use crate::table::{self, cell};
use crate::Service;

#[derive(Args, Debug)]
pub struct Envoys {
    #[command(flatten)]
    service: Service,
}

pub fn run(envoys: &Envoys) -> Result<ExitCode, String> {
    let answer = envoys.service.client()?.get("/admin/v1/envoys")?;
    table::show(envoys.service.json, &answer, fleet);
    Ok(ExitCode::SUCCESS)
}

/// Each Envoy's fields, in the order the table shows them (its headers too).
const FIELDS: [&str; 4] = ["envoy", "last_call_s", "workers", "settlements_dropped"];

fn fleet(answer: &Value) {
    println!(
        "Envoys that called this replica in the last minute: {}; settlements dropped: {}",
        cell(&answer["called_last_minute"]),
        cell(&answer["settlements_dropped"])
    );
    let rows: Vec<Vec<String>> = (answer["envoys"].as_array().into_iter().flatten())
        .map(|e| FIELDS.iter().map(|field| cell(&e[*field])).collect())
        .collect();
    table::print(&FIELDS, &rows);
}
