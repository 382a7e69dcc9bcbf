"""One request from prompt to Done: its state (request.py), the scheduler that plans each step,
the model runner that computes it, the step loop that turns it into events, and the Generation
handle a consumer iterates; sampling, stop rules and detokenizing."""
