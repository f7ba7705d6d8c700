"""The launch-header parser while this folder is the package template.

The ship step replaces this file with a verbatim copy of ``kernels/launch.py`` (standard
library only), so a shipped package resolves grid, block and shared memory with exactly the
code the evaluator used, without importing the engine.
"""

from kernels.launch import (
    DeviceLimits,
    LaunchConfig,
    LaunchLimitError,
    LaunchSpec,
    LaunchSpecError,
    check_limits,
    parse_launch_header,
)

__all__ = [
    "DeviceLimits", "LaunchConfig", "LaunchLimitError", "LaunchSpec", "LaunchSpecError", "check_limits",
    "parse_launch_header",
]
