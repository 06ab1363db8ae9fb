"""What the project measures, one module per benchmark: the couplets' quality (`quality`, also
`python -m couplet.evaluate`), the per-step cost of each mode (`steps`), the peak through the engine
(`serve`), and vLLM's own serving benchmark beside it (`vllm`). Results: docs/results/."""
