"""The shape of the episodes a task samples: shots, query and (classification) ways and remapping.

One small value object shared by both task types (:mod:`fmmeta.tasks.generation`,
:mod:`fmmeta.tasks.classification`) and the collection's YAML, validated when it is made so a bad
shape is refused before any data is read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class EpisodeSpec:
    """The shape of the episodes a task samples.

    Attributes:
        shots: support examples per class (classification) or support size (generation); >= 1.
        query: query examples per class (classification) or query size (generation); >= 1.
        ways: classes per episode for classification (>= 2, at most the task's classes);
            ``None`` means every class for classification and is required for generation tasks.
        remap_labels: classification only: map each episode's classes to random words drawn from
            ``label_pool`` so the model must read the support set to know the answer words.
        label_pool: words for ``remap_labels`` (at least ``ways``, distinct, non-empty).
    """

    shots: int
    query: int
    ways: int | None = None
    remap_labels: bool = False
    label_pool: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.shots, bool) or not isinstance(self.shots, int) or self.shots < 1:
            raise ValueError(
                f"EpisodeSpec.shots={self.shots!r} is invalid: shots must be an int >= 1 "
                "(support examples per class, or per episode for generation tasks)"
            )
        if isinstance(self.query, bool) or not isinstance(self.query, int) or self.query < 1:
            raise ValueError(
                f"EpisodeSpec.query={self.query!r} is invalid: query must be an int >= 1 "
                "(query examples per class, or per episode for generation tasks)"
            )
        if self.ways is not None and (
            isinstance(self.ways, bool) or not isinstance(self.ways, int) or self.ways < 2
        ):
            raise ValueError(
                f"EpisodeSpec.ways={self.ways!r} is invalid: ways must be an int >= 2 "
                "(classes per episode) or None (all classes / a generation task)"
            )
        if self.label_pool is not None:
            pool = tuple(self.label_pool)
            object.__setattr__(self, "label_pool", pool)
            bad = [w for w in pool if not isinstance(w, str) or not w.strip()]
            if bad:
                raise ValueError(
                    f"EpisodeSpec.label_pool contains empty or non-string words {bad!r}: "
                    "every remapping word must be a non-empty string"
                )
            dup = sorted({w for w in pool if pool.count(w) > 1})
            if dup:
                raise ValueError(
                    f"EpisodeSpec.label_pool has duplicate words {dup!r}: remapped classes must "
                    "get distinct words, so list each word once"
                )
        if self.remap_labels:
            if not self.label_pool:
                raise ValueError(
                    "EpisodeSpec.remap_labels=True needs label_pool: pass the words classes are "
                    "remapped to, e.g. label_pool=('apple', 'river', 'stone', 'cloud')"
                )
            if self.ways is not None and len(self.label_pool) < self.ways:
                raise ValueError(
                    f"EpisodeSpec.label_pool has {len(self.label_pool)} words but ways={self.ways}: "
                    f"remapping needs at least {self.ways} distinct words; add words to the pool"
                )

    @property
    def per_class(self) -> int:
        """Examples one class (or a generation task) must supply per episode."""
        return self.shots + self.query


__all__ = ["EpisodeSpec"]
