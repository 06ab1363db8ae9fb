"""Writing couplets on a vLLM server: the HTTP client (`client`), the couplet rules as a logits processor that
runs inside the server (`logits`, `logit_rules`), and the runner of vLLM's own benchmark (`bench_runner`).
Light on imports: the server imports `logits` from its own environment."""
