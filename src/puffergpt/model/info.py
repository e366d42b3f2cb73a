"""The model described for a newcomer: its name as the server shows it, what it is
(``about``), prompts to start from (``starters``), the embedding panel's first words
(``embedding_words``), per model (GPT-2 small's for any other), and the contexts view's
starters (``context_starters``), one word in sentences where it means different things, and a
control sentence where it means what it does in the first."""

from __future__ import annotations

from pathlib import Path


def model_name(model: str) -> str:
    """The name the server shows for its model (/api/info, /v1): a local checkpoint by its
    directory's name, as its full path is the server's business."""
    return Path(model).name if "/" in model else model


STARTERS = {
    # GPT-2 small: recall, copying a repetition (the attention panel shows induction heads), counting.
    "gpt2": [{"kind": "Recall a fact", "prompt": "The capital of France is"},
             {"kind": "Copy a repetition",
              "prompt": "Mr and Mrs Dursley of number four, Privet Drive. Mr and Mrs Dursley of number"},
             {"kind": "Continue a count", "prompt": "1, 2, 3, 4, 5,"},
             # greedy GPT-2 repeats its sentence here (Hugging Face's "How to generate text"): a penalty breaks it
             {"kind": "Break a loop with a penalty", "prompt": "I enjoy walking with my cute dog",
              "sampling": {"temperature": 0, "frequency_penalty": 0.8}}],
    # The demo model learnt WordNet's glosses, fortunes and the copying drill it was given
    # (its model card): prompts in those shapes. The copy prompt answers " 3" at temperature 0.
    "demo": [{"kind": "Define a word", "prompt": "happy (adjective):"},
             {"kind": "Copy a repetition", "prompt": "a = 7\nb = 3\nc = 9\na = 7\nb ="},
             {"kind": "Continue a sentence", "prompt": "He said that she"},
             # at T = 0 it loops ("the first of the world of the\nthe first of the world"); the penalty
             # pushes each repeated token down, and the candidates show by how much
             {"kind": "Break a loop with a penalty", "prompt": "Perl was created by Larry Wall in",
              "sampling": {"temperature": 0, "frequency_penalty": 0.8}}],
}


def starters(model: str) -> list[dict]:
    """Prompts to start from; one may set the page's sampling (``sampling``: its controls' values)."""
    return STARTERS.get(model, STARTERS["gpt2"])


# The contexts view: one word, two or three meanings, and a control: the word in the sense it
# has in the first sentence, so that a pair of different senses is read against a pair of the
# same. GPT-2 reads left to right, so only the words before it can change its vector ("One mole"
# has seen only "One"). The demo's words are ones its training text holds often (token_counts:
# " plant" 1,389 times, " light" 1,326; " mole" only 48, too rare to have moved), each at the
# same position in every sentence, so that every line starts at 1 and only the blocks move it.
CONTEXT_STARTERS = {
    "gpt2": [
        {"kind": "mole", "word": " mole",
         "prompts": ["American shrew mole", "One mole of carbon dioxide", "Take a biopsy of the mole"],
         "control": "The eastern mole"},
        {"kind": "bank", "word": " bank",
         "prompts": ["They sat by the river on the grassy bank", "She put the money she earned in the bank"],
         "control": "The boat drifted toward the muddy bank"},
    ],
    "demo": [
        {"kind": "plant", "word": " plant", "prompts": ["a living green plant", "an industrial power plant"],
         "control": "a wild garden plant"},
        {"kind": "light", "word": " light", "prompts": ["the sun gives light", "the bag is light"],
         "control": "the lamp gives light"},
    ],
}


def context_starters(model: str) -> list[dict]:
    return [dict(s, prompts=list(s["prompts"])) for s in CONTEXT_STARTERS.get(model, CONTEXT_STARTERS["gpt2"])]


# The embedding panel's first words: ones the model trained (an untrained row ties with
# every other and would teach nothing). The demo's analogy is one its card names as right.
EMBEDDING_WORDS = {
    "gpt2": {"neighbours": " king", "analogy": [" man", " king", " woman"],
             "map": [" king", " queen", " man", " woman", " Paris", " France", " London", " England"]},
    "demo": {"neighbours": " house", "analogy": [" he", " she", " his"],
             "map": [" one", " two", " three", " four", " he", " she", " his", " her", " up", " down", " hot",
                     " cold"]},
}


def embedding_words(model: str) -> dict:
    return EMBEDDING_WORDS.get(model, EMBEDDING_WORDS["gpt2"])


def about(model: str, c) -> dict:
    shape = f"{c.n_layer} layers, width {c.n_embd}, {c.n_head} heads, context {c.n_ctx}, vocabulary {c.n_vocab:,}"
    if model == "demo":
        return {"name": "demo", "is_demo": True, "shape": shape,
                "description": "the demo model that ships with puffergpt: GPT-2's architecture and tokenizer, "
                               "4 layers of width 192 trained for under two hours on 2 CPU cores on WordNet's glosses, "
                               "fortunes, Python's docs and copying drills (English perplexity about 600; it writes "
                               "dictionary-like phrases and soon loops at temperature 0; layer 2, head 2 is an "
                               "induction head that copies `name = value` lines; its model card says more)",
                "how_to_get_gpt2": "run `puffergpt serve --model gpt2` (or `make run MODEL=gpt2`) on a machine that "
                                   "can reach the Hugging Face hub once, or `--model PATH` to a local copy in Hugging "
                                   "Face layout"}
    return {"name": model, "is_demo": False, "shape": shape, "description": f"{model}: {shape}",
            "how_to_get_gpt2": None}
