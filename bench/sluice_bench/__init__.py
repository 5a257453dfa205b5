"""The library behind `make bench`, `make bench-instructions`, `make bench-rls`, `make soak`,
`make chaos` and `make siege` (the thin scripts bench/run.py, bench/rls.py, bench/soak.py,
bench/chaos.py and bench/siege.py). Python 3 standard library; the siege also grpcio.

Running things:
  paths          where the scripts read and write (the report files move together with --out)
  processes      commands, children stopped by PID, /proc figures, signals, log lines, failures
  services       redis-server and sluice-service as children
  builds         the wasm fixtures, sluice-service's release build, the micro-benchmarks
  envoy_config   Envoy bootstraps: the direct_response listener, filters, the service's cluster
  envoy          one Envoy process: started on free ports, its stats, stopped by PID
  load           the requests: wrk (plain or with a Lua script), paced keep-alive clients
  measure        CPU time per request over a wrk run, medians, periodic samples
  facts          the machine, the commit and the tools a report names
  markdown       tables, "n/a" figures, verdicts, sections rewritten between markers

The benchmark (BENCHMARKS.md, bench/results.*, bench/history.jsonl, bench/instructions.json):
  setups               the Envoy configurations measured, and the ratios and targets over them
  llm_bodies           the LLM responses (JSON, an event stream) the token-budget setups answer
  cpu_run              make bench: the interleaved rounds under wrk, and results.json
  accuracy             a local policy's admitted requests against the ideal
  global_traffic       a global concurrency policy's calls to sluice-service per 1,000 requests
  instruction_run      make bench-instructions: each setup under callgrind
  history              one line per full run, to tell a change from noise
  benchmarks_report    BENCHMARKS.md, from results.json
  instructions_report  its section on instructions per request, from instructions.json
  chart                bench/results.svg

The RLS against Limitador (make bench-rls: BENCHMARKS.md's rls section, bench/rls.json):
  rls_run              the servers, the load generator and Envoy's own ratelimit filter, interleaved
  rls_report           the section, sluice's figures as ratios over Limitador's

Reliability (docs/reliability.md, each script its own sections):
  reliability_run                       what soak and chaos share around their measurements
  soak_flood, soak_mixed, soak_report   make soak
  chaos_faults, chaos_report            make chaos
  siege_attacks, siege_report           make siege
"""
