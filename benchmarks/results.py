"""What a benchmark section hands to the report: results keyed by stable ids
(e.g. ``vit_b.step.moppa_over_lora``), its summary sentences and its tables."""
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Tuple, Union

Value = Union[float, int, str]


@dataclass
class Table:
    """A markdown table: ``formats`` maps each column to a format spec ('' = str)."""
    title: str
    rows: List[Dict]
    formats: Dict[str, str]

    def markdown(self) -> str:
        keys = list(self.formats)
        lines = ['| ' + ' | '.join(keys) + ' |', '|' + '---|' * len(keys)]
        for row in self.rows:
            lines.append('| ' + ' | '.join(
                format(row[k], self.formats[k]) if self.formats[k] else str(row[k])
                for k in keys) + ' |')
        return '\n'.join(lines)

    @classmethod
    def of_variants(cls, title: str, label_column: str, labels: Mapping[str, str],
                    columns: Mapping[str, Tuple[str, str]],
                    metrics: Mapping[str, Value]) -> 'Table':
        """A row per variant, read from ``metrics`` by id.

        Args:
            label_column: the first column's name; it holds ``labels[variant]``.
            labels: variant id -> display label, in row order.
            columns: column -> (format spec, result id with ``{v}`` for the
                variant id).
        """
        rows = [{label_column: label,
                 **{column: metrics[key.format(v=variant)]
                    for column, (_, key) in columns.items()}}
                for variant, label in labels.items()]
        formats = {label_column: '', **{column: spec for column, (spec, _) in columns.items()}}
        return cls(title, rows, formats)


@dataclass
class SectionResult:
    """One section's results.

    Attributes:
        metrics: result id -> value. Ids start with the section's prefix and
            never change with the display text; targets and the report look
            results up by them.
        summary: sentences for the report's summary list (without the '- ').
        tables: the section's tables, in report order.
    """
    metrics: Dict[str, Value] = field(default_factory=dict)
    summary: List[str] = field(default_factory=list)
    tables: List[Table] = field(default_factory=list)


def all_metrics(results: Mapping[str, SectionResult]) -> Dict[str, Value]:
    """The metrics of every section in one dict; an id given twice is an error."""
    merged, owner = {}, {}
    for section, result in results.items():
        for key, value in result.metrics.items():
            if key in merged:
                raise ValueError(f'result id {key!r} comes from both section '
                                 f'{owner[key]!r} and section {section!r}')
            merged[key], owner[key] = value, section
    return merged


def pct(value: float) -> str:
    """A ratio as a signed change: 1.032 -> '+3.2%'."""
    return f'{100 * (value - 1):+.1f}%'
