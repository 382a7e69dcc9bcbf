"""One request from prompt to Done: the generation loop, sampling, stop rules, detokenizing."""
