"""The couplet itself, independent of any model: text normalisation, tones, the festive lexicon, the rules
and their check, placement of the keywords, the decoding constraints, the prompt and its exemplars, the
project's own 春联, the 横批, and the 干支 year. Light on imports: the vLLM server loads the constraints."""
