"""A GGUF file read in place: its header and tensor table (header.py, file.py), and the Hugging Face config
and tensors it stands for (reader.py), with what each architecture adds (gemma3.py, gemma4.py, gpt_oss.py,
mistral3.py, phi3.py)."""
