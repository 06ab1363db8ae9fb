"""Load on the running page: N concurrent `gradio_client` clients (default 64) each ask for a couplet under
the selected modes; every one must get a well-formed couplet, with no errors, and the engine's prefix-pool
reference counts must be back to zero afterwards.

    python scripts/load_app.py                         # 64 clients, modes full,shared,combo
    python scripts/load_app.py --clients 16 --modes full combo --budget-mb 16

The app runs in this process (as `python app.py` serves it, on a free local port), so the engine's own
counters can be read at the end. A benchmark that prints figures, not a test (CI runs a smaller one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from gradio_client import Client  # noqa: E402

from couplet.bench.serve import phrases  # noqa: E402
from couplet.writing.text import is_han  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--modes", nargs="+", default=["full", "shared", "combo"])
    p.add_argument("--budget-mb", type=float, default=None, help="COUPLET_KV_BUDGET_MB for the app")
    p.add_argument("--best", action="store_true", help="择优 ticked (off on the page by default): 4 drafts per mode")
    args = p.parse_args()
    if args.budget_mb:
        os.environ["COUPLET_KV_BUDGET_MB"] = str(args.budget_mb)
    import app

    demo = app.serve(port=0)
    app.warmed.wait(120)  # its start-up couplet written first, as before any real visitor
    words = phrases()
    try:
        def visit(i: int) -> tuple[str, float, list | None, str]:
            kw = words[i % len(words)]
            t0 = time.perf_counter()
            try:
                out = Client(demo.local_url, verbose=False).predict(
                    kw, 7, False, 0.0, 0, 2026, args.modes, args.best, api_name="/couplet")
                return kw, time.perf_counter() - t0, out[-1], ""
            except Exception as e:  # noqa: BLE001 - counted and printed: a load test reports errors
                return kw, time.perf_counter() - t0, None, f"{type(e).__name__}: {e}"

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            visits = list(pool.map(visit, range(args.clients)))
        wall = time.perf_counter() - t0
        deadline = time.time() + 30
        while (st := app.engine().stats()).in_flight and time.time() < deadline:
            time.sleep(0.05)
    finally:
        demo.close()
    good = 0
    for kw, _, results, error in visits:
        ok = results is not None and [r["mode"] for r in results] == args.modes and all(
            len(r["upper"]) == len(r["lower"]) == 7 and all(map(is_han, r["upper"] + r["lower"] + r["hengpi"]))
            and r["checks"]["passed"] for r in results)
        good += ok
        if error or not ok:
            print(f"  {kw}: {error or 'malformed'}")
    seconds = [v[1] for v in visits]
    print(f"{args.clients} clients, modes {','.join(args.modes)}, budget {app.KV_BUDGET_MB:g} MB: "
          f"{good}/{args.clients} well-formed, {sum(1 for v in visits if v[3])} errors, {wall:.1f} s wall; "
          f"latency median {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s; engine peak "
          f"{st.peak_in_flight} in flight; pool refs after: {st.pool_refs}, reserved after: {st.reserved_bytes}")
    return 0 if good == args.clients and st.pool_refs == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
