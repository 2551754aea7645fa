"""gpushare's shared leaf: the contract every part agrees on (design §1).

Resource names and annotation keys (`keys`), virtual-ID format (`ids`), annotation codecs
(`codecs`), the config loader (`config`), the base error (`errors`) and log helpers
(`log`). It imports none of the parts.
"""

from gpushare.errors import ConfigError, GpushareError, InstructionRefused

__all__ = ["ConfigError", "GpushareError", "InstructionRefused"]
