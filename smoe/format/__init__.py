"""The .smoe format itself: layout plan, records, views, findings, manifest, verifier.

Everything here follows from ``spec/smoe.ksy`` (through ``smoe_gen.layout``) and the
rulings; it reads and checks bytes but never quantises, sculpts or prints.
"""

__all__ = [
    "findings",
    "manifest",
    "plan",
    "records",
    "verify",
    "view",
]
