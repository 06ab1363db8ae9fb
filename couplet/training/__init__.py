"""Training the embedded model: reading the corpus (`corpus`), stage 1 on line pairs (`pairs`), and stage 2
on the long prompt (`context`). Commands, not tests: see docs/model.md."""
