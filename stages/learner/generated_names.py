"""Names that look machine-made: the draft's review lists a name whose
labels look like encoded data or a DGA's (DNS tunnels and exfiltration
spell data into labels), for a person to look at before allowing it."""
from __future__ import annotations

import math
from collections import Counter


def shannon_entropy(text: str) -> float:
    """Bits per character of `text` (0 for the empty string)."""
    if not text:
        return 0.0
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


_HEX = set("0123456789abcdef")


def looks_generated(label: str) -> bool:
    """Does one DNS label look machine-made (encoded data, a DGA name)?

    DNS tunnels and exfiltration spell data into labels: hex, base32 or
    base64 blobs. Words joined by hyphens are judged word by word, so
    `github-production-release-asset` is not flagged. A piece is flagged
    when it is a long hex blob, a long mix of letters and digits with high
    entropy, or long letters-only text with the entropy of random letters
    (English words of that length stay well below it).
    """
    for piece in label.lower().split("-"):
        n = len(piece)
        if n < 10:
            continue
        digits = sum(ch.isdigit() for ch in piece)
        letters = sum(ch.isalpha() for ch in piece)
        entropy = shannon_entropy(piece)
        if n >= 16 and set(piece) <= _HEX and digits and letters:
            return True
        if digits / n >= 0.2 and letters / n >= 0.2 and entropy >= 3.0:
            return True
        if n >= 16 and entropy >= 3.6:
            return True
        if n >= 24 and entropy >= 3.4:
            return True
    return False


def generated_labels(host: str) -> list[str]:
    labels = host.split(".")
    return [label for label in labels[:-1] if looks_generated(label)]

