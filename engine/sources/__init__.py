"""Where a model comes from: the spec the user typed resolved to files (model_source.py), and the stores other
apps keep models in (ollama.py, app_stores.py), each summarized without loading it (model_summary.py).

Above weights/ (which reads the files found here) and below request/. Nothing here copies or writes a model:
another app's files are read where that app keeps them.
"""
