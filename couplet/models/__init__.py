"""Loading a checkpoint (`loading`: the embedded model, a local folder, a Hugging Face or ModelScope id),
how each family is prompted (`families`, `palm`), the character tokenizer, and teacher-forced scoring."""
