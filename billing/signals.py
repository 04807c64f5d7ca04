"""What the billing app announces (see pools/signals.py for the contract)."""

from django.dispatch import Signal

# draft -> finalised (billing.services.statements.finalise_statement): kwargs statement, actor (a user or None).
statement_finalised = Signal()
