"""What tests/faults/sweep.py needs to know of the memory_optimization lab (see its docstring); the
lab has no cases of its own.

Instructor-only: scripts/make-handout leaves labs/*/faults.py out of hand-outs.
"""

BEYOND_THE_MACHINE = [("mem.model.width=65536", ["mem.model.width", "bytes"], "the documented maximum width")]
STOP = {"settings": [], "after": r"sweep: .*batch", "when": "in a study"}
