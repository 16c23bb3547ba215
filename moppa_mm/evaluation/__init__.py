from .vtab_table import PAPER_MOPPA, PAPER_SUMMARY, collect, summarize, table

__all__ = ['PAPER_MOPPA', 'PAPER_SUMMARY', 'collect', 'summarize', 'table']
