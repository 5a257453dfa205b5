//! `sluice rlqs`: the RLQS as the replica asked serves it (`GET /admin/v1/rlqs`): its streams
//! open and, per domain and descriptor of the limits, the Envoys sharing it, the requests per
//! period assigned them now, and what their reports counted.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use crate::table::{self, cell};
use crate::Service;

#[derive(Args, Debug)]
pub struct Rlqs {
    #[command(flatten)]
    service: Service,
}

pub fn run(rlqs: &Rlqs) -> Result<ExitCode, String> {
    let answer = rlqs.service.client()?.get("/admin/v1/rlqs")?;
    table::show(rlqs.service.json, &answer, descriptors);
    Ok(ExitCode::SUCCESS)
}

/// Each descriptor's fields, in the order the table shows them (its headers too).
const FIELDS: [&str; 7] = [
    "domain",
    "descriptor",
    "envoys",
    "assigned",
    "reports",
    "allowed",
    "denied",
];

fn descriptors(answer: &Value) {
    println!("{} streams open on this replica", cell(&answer["streams"]));
    let rows: Vec<Vec<String>> = (answer["descriptors"].as_array().into_iter().flatten())
        .map(|d| FIELDS.iter().map(|field| cell(&d[*field])).collect())
        .collect();
    table::print(&FIELDS, &rows);
}
