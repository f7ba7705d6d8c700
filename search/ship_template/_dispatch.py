"""The dispatch rule while this folder is the package template.

The ship step replaces this file with a verbatim copy of ``kernels/dispatch_rule.py``
(standard library only), so a shipped op picks, on any shape, the kernel the run picked.
"""

from kernels.dispatch_rule import distance, member_for

__all__ = ["distance", "member_for"]
