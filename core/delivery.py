"""``Delivery`` and ``Verdict``, by the name the workers first imported them under.

They are records of the run path and live with the others in ``core.runpath`` (one vocabulary
from the claim to the recorded outcome); this module only names them again, so importers of this
path keep working. New code imports ``duetime.core.runpath``.
"""

from __future__ import annotations

from duetime.core.runpath import Delivery, Verdict

__all__ = ["Delivery", "Verdict"]
