"""CBT (Hill et al. 2016) prompt functions for phaselab's CBT task YAMLs (EXPERIMENTS §2.5).

lm-eval has no CBT task; phaselab scores it as in GPT-2's evaluation: the 20 context sentences
and the question's text up to the blank are the context, and each of the 10 candidates followed
by the rest of the question is a continuation; the prediction is the highest log-likelihood.
Fields of Hugging Face ``cam-cst/cbt`` (configs CN, NE): sentences, question (blank = XXXXX),
answer, options.
"""

BLANK = "XXXXX"


def doc_to_text(doc: dict) -> str:
    head = doc["question"].split(BLANK, 1)[0].rstrip()
    return " ".join([s.strip() for s in doc["sentences"]] + ([head] if head else []))


def doc_to_choice(doc: dict) -> list[str]:
    head, tail = doc["question"].split(BLANK, 1)
    sep = " " if head.endswith(" ") or not head else ""
    return [sep + option + tail for option in doc["options"]]


def doc_to_target(doc: dict) -> int:
    return doc["options"].index(doc["answer"])
