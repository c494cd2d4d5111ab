"""The application layer: what users touch.

The Hydra command line (:mod:`~hexicore.app.cli`) and its commands
(:mod:`hexicore.app.commands`), turning composed configs into domain objects
(:mod:`~hexicore.app.compose`) and into the run a runtime receives
(:mod:`~hexicore.app.training`), the library API (:mod:`~hexicore.app.api`) and its typed results
(:mod:`~hexicore.app.results`), sweep summaries
(:mod:`~hexicore.app.sweep`), tables (:mod:`~hexicore.app.report`), plan pictures
(:mod:`~hexicore.app.picture`) and the generated CLI reference (:mod:`~hexicore.app.docgen`).

May import everything in hexicore. Nothing imports it but the console script and the top-level
:mod:`hexicore` package (the library functions).
"""
