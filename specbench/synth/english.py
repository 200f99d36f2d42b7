"""Small helpers for the generator's templated English, and the calendar words."""

from __future__ import annotations

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)


def with_article(word: str) -> str:
    """The word with its indefinite article ("an engineer", "a baker")."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def capitalized(text: str) -> str:
    """The text with its first letter upper-cased (the rest unchanged)."""
    return text[:1].upper() + text[1:]


def lower_the(sentence: str) -> str:
    """Lower-case a leading "The " so the sentence can follow a comma."""
    return "t" + sentence[1:] if sentence.startswith("The ") else sentence


def join_and(items: list[str]) -> str:
    """"A", "A and B", "A, B and C"."""
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def counted(names: list[str], one: str, many: str) -> str:
    """`one` before a single name, `many` before a list: "river Osk", "rivers Osk and Vell"."""
    return (one if len(names) == 1 else many) + " " + join_and(names)


def word_count(text: str) -> int:
    """The number of whitespace-separated words."""
    return len(text.split())
