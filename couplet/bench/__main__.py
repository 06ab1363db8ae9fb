"""`python -m couplet.bench`: the per-step cost of every mode (`couplet.bench.steps`);
`python -m couplet.bench serve`: the Spring Festival peak through the engine (`couplet.bench.serve`)."""

import sys

from couplet.bench import serve, steps
from couplet.models.hub import ModelUnavailable
from couplet.serving.backends import BackendError

try:
    if sys.argv[1:2] == ["serve"]:
        serve.main(serve.parse_args(sys.argv[2:]))
    else:
        steps.main(steps.parse_args(sys.argv[1:]))
except (ValueError, ModelUnavailable, BackendError) as e:
    print(f"错误 error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
