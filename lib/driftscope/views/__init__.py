"""Layer 10, what the notebooks show: figures and tables of a report (``plots``, ``tables``, ``drill``,
``errormaps``, ``answer``, ``geometry``), commit trends (``trend``, ``history``) and notebook rendering
(``render``, with the ``templates``).

Nothing here names a model family: stage roles come from the report's stage plan and its ``plan_meta``,
and what only a family knows (where a token sits in the image, the geometry figures) is asked of it.
"""
