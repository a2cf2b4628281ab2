"""A synthetic word-level vocabulary: special tokens, fillers, keys ("animals") and values ("names")."""

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

from phaseinterp.errors import UserInputError

SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<sep>", "<q>")

ANIMALS: tuple[str, ...] = tuple("""
cat dog owl fox bee ant elk emu yak ram hen cow pig bat eel cod ape doe gnu jay koi orca seal
wolf bear lion hare mole moth newt puma crab crow dove duck frog goat hawk ibis lark lynx mink
mule toad swan wasp wren tuna
""".split())

NAMES: tuple[str, ...] = tuple("""
Ada Ben Cal Dan Eve Fay Gus Hal Ivy Jon Kim Lee Max Ned Oli Pam Quin Ray Sam Tom Uma Val Wes Xia
Yan Zoe Amy Bob Cy Dee Eli Flo Gil Hap Ian Joy Kai Liv Mo Nia Otto Pia Rex Sue Ted Una Vic Wyn
""".split())

FILLERS: tuple[str, ...] = ("the", "and", "of", "so", "then", "also", "well", "now", "yet", "too", "just", "still")

# Used only when more keys/values are asked for than the base lists hold.
_ADJECTIVES: tuple[str, ...] = ("red", "big", "old", "shy", "odd", "wild", "tiny", "blue")


def _extend(base: tuple[str, ...], n: int, kind: str) -> tuple[str, ...]:
    """``n`` distinct readable words: the base list, then ``adjective-word`` combinations."""
    words = list(base[:n])
    for adjective, word in itertools.product(_ADJECTIVES, base):
        if len(words) >= n:
            break
        words.append(f"{adjective}-{word}")
    if len(words) < n:
        raise UserInputError(f"n_{kind}={n} is too many; at most {len(base) * (1 + len(_ADJECTIVES))} are available")
    return tuple(words)


def _special_id(token: str) -> property:
    """A read-only ``Vocab`` attribute: the id of the special token ``token``."""
    return property(lambda self: self.id(token), doc=f"The id of ``{token}``.")


@runtime_checkable
class Tokenizer(Protocol):
    """What the tasks need from a tokenizer: text to ids and back (HF tokenizers qualify)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Vocab:
    """Word-level vocabulary; token id = index in ``tokens`` (specials, fillers, keys, values).

    ``Vocab.default()`` has 4 specials + 8 fillers + 48 keys + 48 values = 108 tokens, so it
    fits a model with ``d_vocab = 128``; build models with ``d_vocab = vocab.size``.
    ``encode`` also accepts a whitespace-separated string, so a ``Vocab`` is itself a
    word-level :class:`Tokenizer`.
    """

    specials: tuple[str, ...] = SPECIALS
    fillers: tuple[str, ...] = FILLERS[:8]
    keys: tuple[str, ...] = ANIMALS
    values: tuple[str, ...] = NAMES

    def __repr__(self) -> str:  # sizes, not the word lists
        return (f"Vocab({len(self.specials)} specials, {len(self.fillers)} fillers, {len(self.keys)} keys, "
                f"{len(self.values)} values; {self.size} tokens)")

    def __post_init__(self) -> None:
        for name in ("specials", "fillers", "keys", "values"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        missing = [s for s in SPECIALS if s not in self.specials]
        if missing:
            raise UserInputError(f"specials={self.specials} must include {missing}")
        if not self.fillers or not self.keys or not self.values:
            raise UserInputError(
                f"a Vocab needs at least one filler, key and value (got {len(self.fillers)}, "
                f"{len(self.keys)}, {len(self.values)})"
            )
        seen: dict[str, int] = {}
        for word in self.tokens:
            if any(c.isspace() for c in word) or not word:
                raise UserInputError(f"token {word!r} must be a non-empty string without whitespace")
            seen[word] = seen.get(word, 0) + 1
        duplicates = sorted(w for w, c in seen.items() if c > 1)
        if duplicates:
            raise UserInputError(f"tokens must be distinct; duplicated: {duplicates}")
        object.__setattr__(self, "_index", {w: i for i, w in enumerate(self.tokens)})

    @classmethod
    def default(cls) -> "Vocab":
        return cls()

    @classmethod
    def build(cls, n_keys: int = 48, n_values: int = 48, n_fillers: int = 8) -> "Vocab":
        """A vocabulary of the given sizes; words beyond the base lists are ``adjective-word``."""
        for name, value in (("n_keys", n_keys), ("n_values", n_values), ("n_fillers", n_fillers)):
            if value < 1:
                raise UserInputError(f"{name}={value} must be >= 1")
        if n_fillers > len(FILLERS):
            raise UserInputError(f"n_fillers={n_fillers} is out of range (1..{len(FILLERS)})")
        return cls(
            fillers=FILLERS[:n_fillers], keys=_extend(ANIMALS, n_keys, "keys"), values=_extend(NAMES, n_values, "values")
        )

    # ------------------------------------------------------------------ ids
    @property
    def tokens(self) -> tuple[str, ...]:
        return self.specials + self.fillers + self.keys + self.values

    @property
    def size(self) -> int:
        return len(self.specials) + len(self.fillers) + len(self.keys) + len(self.values)

    def _range(self, start: int, n: int) -> tuple[int, ...]:
        return tuple(range(start, start + n))

    @property
    def filler_ids(self) -> tuple[int, ...]:
        return self._range(len(self.specials), len(self.fillers))

    @property
    def key_ids(self) -> tuple[int, ...]:
        return self._range(len(self.specials) + len(self.fillers), len(self.keys))

    @property
    def value_ids(self) -> tuple[int, ...]:
        return self._range(len(self.specials) + len(self.fillers) + len(self.keys), len(self.values))

    def id(self, token: str) -> int:
        try:
            return self._index[token]  # type: ignore[attr-defined]
        except KeyError:
            raise KeyError(f"token {token!r} is not in this {self.size}-token vocabulary") from None

    pad_id = _special_id("<pad>")
    bos_id = _special_id("<bos>")
    sep_id = _special_id("<sep>")
    query_id = _special_id("<q>")
    # HF-style aliases so a Vocab can stand in for a tokenizer.
    bos_token_id = _special_id("<bos>")
    pad_token_id = _special_id("<pad>")

    # ------------------------------------------------------------- encode/decode
    def encode(self, words: str | Sequence[str]) -> list[int]:
        """Token ids for a list of words, or for a whitespace-separated string."""
        if isinstance(words, str):
            words = words.split()
        return [self.id(w) for w in words]

    def decode(self, ids: Iterable[Any]) -> str:
        """Readable text: the words joined by spaces (accepts ints, numpy or torch ids)."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.size:
                raise UserInputError(f"token id {i} is out of range for this vocabulary (0..{self.size - 1})")
            out.append(self.tokens[i])
        return " ".join(out)

    # ------------------------------------------------------------ (de)serialize
    def to_dict(self) -> dict[str, list[str]]:
        return {name: list(getattr(self, name)) for name in ("specials", "fillers", "keys", "values")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Vocab":
        known = {"specials", "fillers", "keys", "values"}
        unknown = set(d) - known
        if unknown:
            raise UserInputError(f"unknown Vocab fields {sorted(unknown)}; valid fields: {sorted(known)}")
        return cls(**{k: tuple(v) for k, v in d.items()})
