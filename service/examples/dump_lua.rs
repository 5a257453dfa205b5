//! `cargo run -p sluice-service --example dump_lua -- DIR`: writes the Lua scripts as Redis gets
//! them into DIR (`<name>.lua`), to measure them alone (`bench/redis_lua.py`, `redis-benchmark`,
//! `SLOWLOG`).

use sluice_service::stores::redis::{
    CALENDAR_WINDOW_LUA, CHECKS_LUA, FIXED_WINDOW_LUA, LEAKY_BUCKET_LUA, SLIDING_WINDOW_LUA,
    TOKEN_BUCKET_LUA,
};

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: dump_lua DIR");
        std::process::exit(2);
    };
    for (name, script) in [
        ("token_bucket", TOKEN_BUCKET_LUA),
        ("fixed_window", FIXED_WINDOW_LUA),
        ("calendar_window", CALENDAR_WINDOW_LUA),
        ("sliding_window", SLIDING_WINDOW_LUA),
        ("leaky_bucket", LEAKY_BUCKET_LUA),
        ("checks", CHECKS_LUA),
    ] {
        std::fs::write(format!("{dir}/{name}.lua"), script)?;
    }
    Ok(())
}
