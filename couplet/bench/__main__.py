"""`python -m couplet.bench`: the per-step cost of every mode (`couplet.bench.steps`);
`python -m couplet.bench serve`: the Spring Festival peak through the engine (`couplet.bench.serve`)."""

import sys

from couplet.bench.steps import cli

cli(sys.argv[1:])
