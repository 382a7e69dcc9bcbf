"""The prompt of a turn: a conversation's messages become the text of the model's chat template (or the
standard format chosen for a model without one), with the thinking switch and a compacted branch's
summary in their place, and then token ids that extend what the model has already seen; a prompt that
leaves the reply too little of the context window is refused, and the stop texts that end a reply are here."""
