"""A model reading: decoding spans, choosing across windows, a split's answers, the vote."""
