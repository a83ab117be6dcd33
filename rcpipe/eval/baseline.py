"""A lexical baseline with no learning: the floor every trained model must clear.

In the sentence that shares the most words with the question, answer the first run of up
to ``max_len`` tokens that the question does not contain (Rajpurkar et al. 2016 report a
sliding-window baseline of the same spirit). It needs only the prepared Parquet columns.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def lexical_answer(context: str, starts: list[int], ends: list[int], question: str,
                   max_len: int = 3) -> str:
    """The baseline's answer text for one question (character spans from the tokenizer)."""
    if not starts:
        return ""
    q = _words(question)
    # sentences: token runs ended by a token that is exactly . ! or ?
    sentences, cur = [], []
    for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
        cur.append(i)
        if context[s:e] in (".", "!", "?"):
            sentences.append(cur)
            cur = []
    if cur:
        sentences.append(cur)
    best = max(sentences, key=lambda sent: len(q & {context[starts[i]:ends[i]].lower()
                                                     for i in sent}))
    new = [i for i in best if context[starts[i]:ends[i]].lower() not in q
           and _WORD.search(context[starts[i]:ends[i]])]
    if not new:
        return ""
    run = [new[0]]
    for i in new[1:]:
        if i != run[-1] + 1 or len(run) == max_len:
            break
        run.append(i)
    return context[starts[run[0]]:ends[run[-1]]]
