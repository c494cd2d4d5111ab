"""Elastic replanning: a previous plan repaired after losing devices (:mod:`.repair`) and how
the new plan differs from it (:mod:`.diff`)."""
