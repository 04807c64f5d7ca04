"""What the monitoring app announces: events a higher layer (notifications) may tell people about.

Sent by the detecting service inside its transaction, after the row is written (see pools/signals.py for
the contract). `sender` is the model class of the row.
"""

from django.dispatch import Signal

# A new idle flag on an active allocation (monitoring.services.idle.detect_idle): kwargs flag (IdleReservation).
idle_reservation_flagged = Signal()

# A new trespass on a project's allocated unit (monitoring.services.trespass.detect_trespass): kwargs event
# (TrespassEvent, owner_project set). Trespasses on unallocated units have no owner to tell; not sent.
trespass_opened = Signal()
