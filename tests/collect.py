"""A hook sink for tests: records every value of the hook points it is asked for."""

from __future__ import annotations

from sinkscope.capture import hooks as hp


class Collect:
    """Observes ``templates`` (default: attention records and resid_post); ``replacements`` maps an
    intervenable template to ``fn(layer, value) -> replacement``."""

    def __init__(self, *templates: str, replacements: dict | None = None):
        self.observed = frozenset(templates or (hp.ATTN, hp.RESID_POST))
        self.replacements = dict(replacements or {})
        self.intervened = frozenset(self.replacements)
        self.values: dict[str, dict] = {t: {} for t in self.observed}
        self.records = []
        self.order: list[tuple[str, int | None]] = []

    def emit(self, template, layer, value):
        self.values[template][layer] = value
        self.order.append((template, layer))
        if template == hp.ATTN:
            self.records.append(value)

    def replace(self, template, layer, value):
        return self.replacements[template](layer, value)

    @property
    def residual(self) -> dict:
        return self.values.get(hp.RESID_POST, {})
