"""What `make soak` and `make chaos` share around their measurements: the checks before, the
facts, a bound on the whole run, a scratch directory, the raw results as JSON (--json) and the
sections of docs/reliability.md they rewrite."""

import signal
import tempfile
from pathlib import Path

from .builds import require_wasm
from .envoy import find_envoy
from .facts import reliability_facts
from .paths import RELIABILITY_MD, ROOT, write_json
from .processes import install_signal_handlers, log, require


def run_reliability(name, command, tools, bound_s, measure, report, json_path=None):
    """`measure(envoy_bin, workdir)`: the raw results, a dict (within `bound_s` seconds);
    `report(info, results)`: writes the sections, and returns their lines, which are printed."""
    require(*tools)
    require_wasm(f"make {name}")
    install_signal_handlers()
    envoy_bin = find_envoy()
    info = reliability_facts(envoy_bin, command)
    signal.alarm(int(bound_s))
    with tempfile.TemporaryDirectory(prefix=f"sluice-{name}-") as tmp:
        results = measure(envoy_bin, Path(tmp))
    signal.alarm(0)
    if json_path:
        write_json(json_path, {"info": info, **results})
    print("\n".join(report(info, results)))
    log(f"wrote the {name} section of {RELIABILITY_MD.relative_to(ROOT)}")
    return results
