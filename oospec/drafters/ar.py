"""`ar`: no drafts. Plain greedy decoding through the same loop, the baseline every method is measured against."""

from oospec.drafters.base import Drafter


class AutoregressiveDrafter(Drafter):
    name = "ar"
