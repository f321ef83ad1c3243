"""synthetic-nli: a generated 3-way NLI set with the multi_nli column schema.

Every premise names two objects, "<subject> <verb> the <moved> next to the <landmark> in the <place> ."
and every hypothesis names one, "<subject> <verb> the <claimed> .". The label is a relation between
the two sentences, never a property of the hypothesis alone:

- entailment (0):    <claimed> is <moved>;
- neutral (1):       <claimed> is not in the premise (it says nothing about that object);
- contradiction (2): <claimed> is <landmark> (the premise says it was the other one).

The claimed object is uniformly distributed under every label, so a model that sees only the
hypothesis stays at chance (tests/integration/test_data.py checks this), while one that reads both sentences
reaches > 0.9 with the tiny BERT in a few epochs.
"""

from __future__ import annotations

import random
from typing import Any

LABEL_NAMES = ("entailment", "neutral", "contradiction")
COLUMNS = (
    "promptID",
    "pairID",
    "premise",
    "premise_binary_parse",
    "premise_parse",
    "hypothesis",
    "hypothesis_binary_parse",
    "hypothesis_parse",
    "genre",
    "label",
)

SUBJECTS = [
    "alice",
    "bob",
    "carol",
    "dave",
    "erin",
    "frank",
    "grace",
    "heidi",
    "ivan",
    "judy",
    "mallory",
    "nina",
    "oscar",
    "peggy",
    "quentin",
    "rupert",
    "sybil",
    "trent",
    "ursula",
    "victor",
    "wendy",
    "xavier",
    "yolanda",
    "zack",
]
VERBS = [
    "bought",
    "sold",
    "painted",
    "moved",
    "cleaned",
    "found",
    "lost",
    "fixed",
    "carried",
    "opened",
    "hid",
    "borrowed",
]
OBJECTS = [
    "lamp",
    "chair",
    "table",
    "kettle",
    "bicycle",
    "guitar",
    "mirror",
    "basket",
    "ladder",
    "clock",
    "window",
    "drum",
    "piano",
    "sofa",
    "bucket",
    "candle",
    "helmet",
    "jacket",
    "rope",
    "shovel",
    "teapot",
    "violin",
    "wagon",
    "umbrella",
]
PLACES = ["garden", "kitchen", "garage", "market", "station", "library", "harbor", "attic", "office", "barn"]
GENRES = ("fiction", "government", "slate", "telephone", "travel")


def _parse(tokens: list[str]) -> str:
    return "( " + " ".join(tokens) + " )"


def generate(num_examples: int, seed: int = 42) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(num_examples):
        subject, verb = rng.choice(SUBJECTS), rng.choice(VERBS)
        moved, landmark = rng.sample(OBJECTS, 2)
        label = rng.randrange(3)
        claimed = (moved, rng.choice([o for o in OBJECTS if o not in (moved, landmark)]), landmark)[label]
        premise = [subject, verb, "the", moved, "next", "to", "the", landmark, "in", "the", rng.choice(PLACES), "."]
        hypothesis = [subject, verb, "the", claimed, "."]
        rows.append(
            {
                "promptID": i // 3,
                "pairID": f"{i}{LABEL_NAMES[label][0]}",
                "premise": " ".join(premise),
                "premise_binary_parse": _parse(premise),
                "premise_parse": f"(ROOT {_parse(premise)})",
                "hypothesis": " ".join(hypothesis),
                "hypothesis_binary_parse": _parse(hypothesis),
                "hypothesis_parse": f"(ROOT {_parse(hypothesis)})",
                "genre": rng.choice(GENRES),
                "label": label,
            }
        )
    return rows
