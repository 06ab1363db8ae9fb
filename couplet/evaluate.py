"""`python -m couplet.evaluate`, the documented name of the quality benchmark (`couplet.bench.quality`)."""

from couplet.bench.quality import cli

if __name__ == "__main__":
    cli()
