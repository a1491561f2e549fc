"""How a model family hands over its attention: one uniform record per layer.

``capture(model, tap)`` is the only entry point; ``AttentionRecord`` is what probes see.
"""

from sinkscope.capture.attention import IMPLEMENTATION, Tap, capture, register_interfaces
from sinkscope.capture.families import FAMILIES, Family, ModelSpec, family_of, supported_families
from sinkscope.capture.record import AttentionRecord

__all__ = [
    "FAMILIES",
    "IMPLEMENTATION",
    "AttentionRecord",
    "Family",
    "ModelSpec",
    "Tap",
    "capture",
    "family_of",
    "register_interfaces",
    "supported_families",
]
