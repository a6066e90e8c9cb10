"""The toy task (docs/design.md §10): short math problems that need computation, not insight.

A tiny model cannot multiply two 4-digit numbers or take ``3^123 mod 1000`` in its head, but one
line of Python can, so tool use is what makes the problems solvable. Each problem carries its exact
integer answer and one line of correct Python that prints it.

Held-out problems are decided by a hash of the problem text, not by the draw: a text is held out iff
``sha256(text) mod 10_000 < heldout_fraction * 10_000``. Train draws skip held-out texts and eval draws
keep only them, so no train set (of any seed or size, SFT traces included) ever meets an eval set.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from typing import Any, Callable

KINDS = ("mul", "powmod", "digitsum", "gcd", "lcm", "sumsq", "factmod")
SPLITS = ("train", "eval")
_MAX_DIGITS = 12  # keeps every problem text short (a whole trajectory is a few hundred byte tokens)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ToyConfig:
    """Difficulty knobs of the toy generator (digit counts are exact unless said otherwise)."""

    kinds: tuple[str, ...] = KINDS  # problem kinds drawn uniformly
    mul_digits: int = 4  # mul: digits of each factor of a*b
    pow_exp_digits: int = 3  # powmod: digits of the exponent (base is 2..99)
    pow_mod_digits: int = 3  # powmod: digits of the modulus
    digitsum_exp_digits: int = 2  # digitsum: digits of the exponent e in "digit sum of b^e" (b is 2..99)
    gcd_digits: int = 6  # gcd: digits of both numbers (they share a factor of about half as many digits)
    lcm_digits: int = 4  # lcm: digits of both numbers (they share a small factor)
    sumsq_digits: int = 3  # sumsq: digits of n in 1^2+...+n^2
    sumsq_digits_max: int | None = None  # if set: n's digit count drawn uniformly in [sumsq_digits, this]
    fact_n_max: int = 99  # factmod: n! with n in 20..fact_n_max
    fact_mod_digits: int = 4  # factmod: digits of the prime modulus (> fact_n_max)
    heldout_fraction: float = 0.125  # share of the problem space reserved for eval (by text hash)

    def __post_init__(self) -> None:
        if not isinstance(self.kinds, tuple) or not self.kinds or any(k not in KINDS for k in self.kinds):
            raise ValueError(f"ToyConfig.kinds must be a non-empty tuple drawn from {KINDS}, got {self.kinds!r}")
        if len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"ToyConfig.kinds has duplicates: {self.kinds!r}")
        lows = {"mul_digits": 1, "pow_exp_digits": 1, "pow_mod_digits": 1, "digitsum_exp_digits": 1,
                "gcd_digits": 2, "lcm_digits": 2, "sumsq_digits": 1, "fact_mod_digits": 2}
        for name, low in lows.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= _MAX_DIGITS:
                raise ValueError(f"ToyConfig.{name} must be an int in [{low}, {_MAX_DIGITS}], got {value!r}")
        if self.sumsq_digits_max is not None and not (
                isinstance(self.sumsq_digits_max, int) and self.sumsq_digits <= self.sumsq_digits_max <= _MAX_DIGITS):
            raise ValueError(f"ToyConfig.sumsq_digits_max must be None or an int in [sumsq_digits="
                             f"{self.sumsq_digits}, {_MAX_DIGITS}], got {self.sumsq_digits_max!r}")
        if not isinstance(self.fact_n_max, int) or not 20 <= self.fact_n_max <= 999:
            raise ValueError(f"ToyConfig.fact_n_max must be an int in [20, 999], got {self.fact_n_max!r}")
        if 10 ** self.fact_mod_digits - 1 <= self.fact_n_max:
            raise ValueError(f"ToyConfig.fact_mod_digits={self.fact_mod_digits} leaves no prime modulus above "
                             f"fact_n_max={self.fact_n_max} (n! mod p would be 0)")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"ToyConfig.heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class ToyProblem:
    id: str  # "toy-<kind>-<hash of the text>": unique per text
    problem: str  # e.g. "What is 4821*7390?"
    answer: str  # exact integer, e.g. "35627190"
    code: str  # one line of Python that prints the answer
    kind: str  # one of KINDS

    def to_record(self) -> dict[str, Any]:
        """The dataset record (``datasets.load_dataset`` reads it back, ``kind``/``code`` as extras)."""
        return {"id": self.id, "problem": self.problem, "answer": self.answer, "kind": self.kind,
                "code": self.code, "source": "toy"}


def _digits(rng: random.Random, d: int) -> int:
    return rng.randrange(10 ** (d - 1) if d > 1 else 2, 10 ** d)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % p for p in range(2, math.isqrt(n) + 1))


def _shared_factor_pair(rng: random.Random, d: int, factor_digits: int) -> tuple[int, int]:
    """Two distinct d-digit numbers with a common factor of ``factor_digits`` digits."""
    while True:
        g = _digits(rng, factor_digits)
        lo, hi = -(-10 ** (d - 1) // g), (10 ** d - 1) // g  # multipliers keeping g*x at d digits
        if hi - lo >= 1:
            x, y = rng.randint(lo, hi), rng.randint(lo, hi)
            if x != y:
                return g * x, g * y


def _mul(rng: random.Random, cfg: ToyConfig) -> tuple[str, int, str]:
    a, b = _digits(rng, cfg.mul_digits), _digits(rng, cfg.mul_digits)
    return f"What is {a}*{b}?", a * b, f"print({a}*{b})"


def _powmod(rng: random.Random, cfg: ToyConfig) -> tuple[str, int, str]:
    b, e, m = rng.randint(2, 99), _digits(rng, cfg.pow_exp_digits), _digits(rng, cfg.pow_mod_digits)
    return f"Compute {b}^{e} mod {m}.", pow(b, e, m), f"print(pow({b}, {e}, {m}))"


def _digitsum(rng: random.Random, cfg: ToyConfig) -> tuple[str, int, str]:
    b, e = rng.randint(2, 99), _digits(rng, cfg.digitsum_exp_digits)
    return (f"What is the digit sum of {b}^{e}?", sum(map(int, str(b ** e))),
            f"print(sum(map(int, str({b}**{e}))))")


def _gcd(rng: random.Random, cfg: ToyConfig) -> tuple[str, int, str]:
    a, b = _shared_factor_pair(rng, cfg.gcd_digits, cfg.gcd_digits // 2)
    return f"What is gcd({a}, {b})?", math.gcd(a, b), f"import math; print(math.gcd({a}, {b}))"


def _lcm(rng: random.Random, cfg: ToyConfig) -> tuple[str, int, str]:
    a, b = _shared_factor_pair(rng, cfg.lcm_digits, max(1, cfg.lcm_digits // 3))
    return f"What is lcm({a}, {b})?", math.lcm(a, b), f"import math; print(math.lcm({a}, {b}))"


def _sumsq(rng: random.Random, cfg: ToyConfig) -> tuple[str, int, str]:
    d = cfg.sumsq_digits if cfg.sumsq_digits_max is None else rng.randint(cfg.sumsq_digits, cfg.sumsq_digits_max)
    n = _digits(rng, d)
    return (f"What is 1^2+2^2+...+{n}^2?", n * (n + 1) * (2 * n + 1) // 6,
            f"print(sum(k*k for k in range(1, {n}+1)))")  # a pure copy of n: no mental arithmetic


def _factmod(rng: random.Random, cfg: ToyConfig) -> tuple[str, int, str]:
    n = rng.randint(20, cfg.fact_n_max)
    lo = max(cfg.fact_n_max + 1, 10 ** (cfg.fact_mod_digits - 1))
    while not _is_prime(p := rng.randint(lo, 10 ** cfg.fact_mod_digits - 1)):
        pass
    return f"Compute {n}! mod {p}.", math.factorial(n) % p, f"import math; print(math.factorial({n}) % {p})"


_MAKERS: dict[str, Callable[[random.Random, ToyConfig], tuple[str, int, str]]] = {
    "mul": _mul, "powmod": _powmod, "digitsum": _digitsum, "gcd": _gcd, "lcm": _lcm, "sumsq": _sumsq,
    "factmod": _factmod,
}


def text_hash(problem: str) -> str:
    return hashlib.sha256(problem.encode("utf-8")).hexdigest()


def is_heldout(problem: str, cfg: ToyConfig = ToyConfig()) -> bool:
    """True iff the problem text belongs to the eval side of the partition (a pure function of the text)."""
    return int(text_hash(problem)[:8], 16) % 10_000 < round(cfg.heldout_fraction * 10_000)


def make_problem(kind: str, rng: random.Random, cfg: ToyConfig = ToyConfig()) -> ToyProblem:
    """One problem of ``kind`` drawn with ``rng`` (no split filtering)."""
    if kind not in _MAKERS:
        raise ValueError(f"unknown toy kind {kind!r}; valid kinds are {KINDS}")
    text, answer, code = _MAKERS[kind](rng, cfg)
    return ToyProblem(id=f"toy-{kind}-{text_hash(text)[:12]}", problem=text, answer=str(answer), code=code,
                      kind=kind)


def generate(n: int, *, seed: int, split: str, cfg: ToyConfig = ToyConfig(),
             max_attempts_per_problem: int = 200) -> list[ToyProblem]:
    """``n`` distinct problems of ``split`` ("train" or "eval"), deterministic in (n, seed, split, cfg).

    The first ``k`` problems for a given seed do not depend on ``n`` (a longer list extends a shorter one).
    Raises ``ValueError`` when the configured problem space is too small to yield ``n`` distinct problems.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    rng = random.Random(f"rstar2-toy:{split}:{seed}")  # str seeds are hashed with sha512: stable across runs
    want_heldout = split == "eval"
    out: list[ToyProblem] = []
    seen: set[str] = set()
    budget = max_attempts_per_problem * max(n, 1)
    while len(out) < n:
        if budget == 0:
            raise ValueError(f"could only draw {len(out)} of {n} distinct {split} problems from {cfg}; "
                             "raise the digit counts or add kinds")
        budget -= 1
        p = make_problem(rng.choice(cfg.kinds), rng, cfg)
        if p.problem in seen or is_heldout(p.problem, cfg) != want_heldout:
            continue
        seen.add(p.problem)
        out.append(p)
    return out


def make_splits(seed: int, n_train: int, n_eval: int,
                cfg: ToyConfig = ToyConfig()) -> tuple[list[ToyProblem], list[ToyProblem]]:
    """(train, eval): distinct problems each, disjoint by text (checked), deterministic per seed."""
    train = generate(n_train, seed=seed, split="train", cfg=cfg)
    held = generate(n_eval, seed=seed, split="eval", cfg=cfg)
    overlap = {p.problem for p in train} & {p.problem for p in held}
    if overlap:  # impossible by construction; a guard against edits to is_heldout
        raise AssertionError(f"train/eval overlap: {sorted(overlap)[:3]}")
    return train, held
