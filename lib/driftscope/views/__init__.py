"""What the notebooks show: figures and tables of a report (``plots``, ``tables``, ``drill``, ``errormaps``,
``answer``, ``geometry``), the evidence index of a batch (``evidence``) and commit trends (``trend``).

Nothing here names a model family: stage roles come from the report's stage plan and its ``plan_meta``,
and what only a family knows (where a token sits in the image, the geometry figures) is asked of it.
"""
