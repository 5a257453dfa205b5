//! What an answer looks like: for a human, aligned columns; with `--json`, the JSON itself.

use serde_json::Value;

/// Prints `rows` under `headers`, each column as wide as its widest cell.
pub fn print(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = (cells.iter().zip(&widths))
            .map(|(cell, &width)| format!("{cell:width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// A field as a cell: strings without quotes, absent as `-`.
pub fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Milliseconds as a human reads them.
pub fn ms(value: &Value) -> String {
    match value.as_u64() {
        None => "-".to_string(),
        Some(ms) if ms < 1000 => format!("{ms}ms"),
        Some(ms) if ms < 120_000 => format!("{:.1}s", ms as f64 / 1000.0),
        Some(ms) if ms < 7_200_000 => format!("{}m", ms / 60_000),
        Some(ms) if ms < 172_800_000 => format!("{}h", ms / 3_600_000),
        Some(ms) => format!("{}d", ms / 86_400_000),
    }
}

/// `json` as it came (`--json`), or `human` of it.
pub fn show(json: bool, value: &Value, human: impl FnOnce(&Value)) {
    if json {
        println!("{value}");
    } else {
        human(value);
    }
}
