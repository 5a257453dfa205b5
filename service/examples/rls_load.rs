//! A load generator for Envoy's Rate Limit Service protocol: `ShouldRateLimit` over gRPC, with
//! `--concurrency` calls in flight over `--connections` HTTP/2 connections, each call one
//! descriptor `(KEY=<value>)` of `--keys` values picked at random, for `--duration` seconds (and
//! at most `--max-calls` calls). Prints one JSON line: calls, their codes, errors, calls/s and
//! latency percentiles. `bench/rls.py` runs it against sluice-service --rls and Limitador.
//!
//! ```sh
//! cargo run --release -p sluice-service --example rls_load -- \
//!   --target 127.0.0.1:8081 --domain bench --keys 1000 --concurrency 32 --duration 5
//! ```
//!
//! `--probe SECONDS`: instead, call once a tenth of a second until a call answers OK (exit 0)
//! or the seconds pass (exit 1): whether a server is ready.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::{Channel, Endpoint};

/// The most calls one run may make, whatever `--max-calls` says: the latencies are kept.
const CALL_CAP: u64 = 50_000_000;
/// A call that takes longer than this is an error (the server is stuck, not slow).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Parser, Debug)]
#[command(name = "rls_load")]
struct Args {
    /// The RLS's address, HOST:PORT (HTTP/2 cleartext)
    #[arg(long)]
    target: String,
    /// The request's domain (Limitador's namespace)
    #[arg(long, default_value = "bench")]
    domain: String,
    /// The descriptor's one entry's key; its value is `<prefix><n>`
    #[arg(long, default_value = "user")]
    key: String,
    #[arg(long, default_value = "user-")]
    prefix: String,
    /// How many distinct values (keys); 1: one hot key
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    keys: u64,
    /// Calls in flight at once
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    concurrency: u64,
    /// HTTP/2 connections the calls share, round robin (each carries concurrency/connections
    /// streams, under a server's per-connection stream limit)
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    connections: u64,
    /// Seconds of calls measured
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Seconds of calls before, not measured
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// At most this many measured calls
    #[arg(long, default_value_t = 10_000_000)]
    max_calls: u64,
    /// The request's hits_addend (0: the protocol's default, one)
    #[arg(long, default_value_t = 0)]
    hits: u32,
    /// Probe readiness for at most this many seconds instead of loading
    #[arg(long)]
    probe: Option<f64>,
}

/// What one task saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    over_limit: u64,
    other_code: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_us: Vec<u32>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.other_code += other.other_code;
        self.errors += other.errors;
        self.first_error = self.first_error.take().or(other.first_error);
        self.latencies_us.extend(other.latencies_us);
    }
}

fn request(args: &Args, value: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: args.key.clone(),
                value: format!("{}{value}", args.prefix),
            }],
            ..Default::default()
        }],
        hits_addend: args.hits,
    }
}

/// xorshift64*: a key per call, uniform enough and without a dependency.
struct Keys {
    state: u64,
    keys: u64,
}

impl Keys {
    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) % self.keys
    }
}

async fn connect(target: &str) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("http://{target}"))
        .map_err(|e| e.to_string())?
        .timeout(CALL_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true);
    endpoint
        .connect()
        .await
        .map_err(|e| format!("{target}: {e}"))
}

/// Calls one after another until `until`, each timed when `measure_from` has passed; at most
/// `budget` measured calls.
async fn worker(
    mut client: RateLimitServiceClient<Channel>,
    requests: Vec<RateLimitRequest>,
    mut keys: Keys,
    measure_from: Instant,
    until: Instant,
    budget: u64,
) -> Tally {
    let mut tally = Tally::default();
    let mut measured = 0u64;
    while measured < budget {
        let started = Instant::now();
        if started >= until {
            break;
        }
        let Some(call) = usize::try_from(keys.next())
            .ok()
            .and_then(|i| requests.get(i))
        else {
            break;
        };
        let answer = client.should_rate_limit(call.clone()).await;
        if started < measure_from {
            continue;
        }
        measured += 1;
        let micros = started.elapsed().as_micros();
        tally
            .latencies_us
            .push(u32::try_from(micros).unwrap_or(u32::MAX));
        match answer.map(|r| Code::try_from(r.into_inner().overall_code)) {
            Ok(Ok(Code::Ok)) => tally.ok += 1,
            Ok(Ok(Code::OverLimit)) => tally.over_limit += 1,
            Ok(_) => tally.other_code += 1,
            Err(status) => {
                tally.errors += 1;
                if tally.first_error.is_none() {
                    tally.first_error = Some(status.to_string());
                }
            }
        }
    }
    tally
}

/// The value at `fraction` of the sorted latencies, in ms.
fn percentile_ms(sorted: &[u32], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let last = sorted.len() - 1;
    let at = ((last as f64) * fraction).round() as usize;
    f64::from(sorted.get(at.min(last)).copied().unwrap_or(0)) / 1000.0
}

fn json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

async fn probe(args: &Args, seconds: f64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds.clamp(0.0, 600.0));
    let mut last = String::from("no call made");
    while Instant::now() < deadline {
        match connect(&args.target).await {
            Ok(channel) => {
                let mut client = RateLimitServiceClient::new(channel);
                match client.should_rate_limit(request(args, 0)).await {
                    Ok(answer) if answer.get_ref().overall_code == Code::Ok as i32 => return Ok(()),
                    Ok(answer) => last = format!("code {}", answer.get_ref().overall_code),
                    Err(status) => last = status.to_string(),
                }
            }
            Err(error) => last = error,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{} not ready: {last}", args.target))
}

async fn load(args: &Args) -> Result<String, String> {
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(connect(&args.target).await?);
    }
    let requests: Vec<RateLimitRequest> = (0..args.keys).map(|n| request(args, n)).collect();
    let duration = args.duration.clamp(0.1, 3600.0);
    let warmup = args.warmup.clamp(0.0, 600.0);
    let measure_from = Instant::now() + Duration::from_secs_f64(warmup);
    let until = measure_from + Duration::from_secs_f64(duration);
    let budget = args.max_calls.min(CALL_CAP);
    let per_task = budget.div_ceil(args.concurrency).max(1);
    let mut tasks = Vec::new();
    for (task, channel) in (0..args.concurrency).zip(channels.iter().cycle()) {
        let keys = Keys {
            state: 0x9e37_79b9_7f4a_7c15 ^ (task + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9),
            keys: args.keys,
        };
        let client = RateLimitServiceClient::new(channel.clone());
        tasks.push(tokio::spawn(worker(
            client,
            requests.clone(),
            keys,
            measure_from,
            until,
            per_task,
        )));
    }
    let mut tally = Tally::default();
    for task in tasks {
        tally.add(task.await.map_err(|e| e.to_string())?);
    }
    let elapsed = measure_from.elapsed().as_secs_f64().max(1e-9);
    tally.latencies_us.sort_unstable();
    let calls = tally.latencies_us.len();
    Ok(format!(
        concat!(
            r#"{{"calls": {}, "ok": {}, "over_limit": {}, "other_code": {}, "errors": {}, "#,
            r#""first_error": {}, "seconds": {:.3}, "calls_per_s": {:.1}, "p50_ms": {:.3}, "#,
            r#""p99_ms": {:.3}, "max_ms": {:.3}, "keys": {}, "concurrency": {}, "connections": {}}}"#
        ),
        calls,
        tally.ok,
        tally.over_limit,
        tally.other_code,
        tally.errors,
        tally
            .first_error
            .as_deref()
            .map_or("null".into(), json_string),
        elapsed,
        calls as f64 / elapsed,
        percentile_ms(&tally.latencies_us, 0.50),
        percentile_ms(&tally.latencies_us, 0.99),
        percentile_ms(&tally.latencies_us, 1.0),
        args.keys,
        args.concurrency,
        args.connections,
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let outcome = match args.probe {
        Some(seconds) => probe(&args, seconds).await.map(|()| String::new()),
        None => load(&args).await,
    };
    match outcome {
        Ok(line) => {
            if !line.is_empty() {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("rls_load: {error}");
            ExitCode::FAILURE
        }
    }
}
