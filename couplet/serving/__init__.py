"""Serving couplets: the engine that batches every visitor's requests and admits them by KV budget
(`engine`), the decoding loop that writes one wave of couplets through a KV-cache mode (`generate`), and the
choice of backend, this process or a vLLM server (`backends`). The per-step records that flow back up are
`couplet.events`, shared by every layer."""
