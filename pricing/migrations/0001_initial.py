"""RateCard and RateCardEntry move here from billing, tables and data untouched.

State only: the tables (`billing_ratecard`, `billing_ratecardentry`) were created by billing.0001
and keep their names (db_table), their constraints and their rows (the default card of billing.0002
included). The content types move with the models (app_label billing -> pricing), so existing
Permission rows, the Operators group's grants, users' direct grants and admin log entries keep
pointing at the same models on an upgraded database. On a fresh database there are no content types
yet (they are created after migrate), so the rename finds nothing. The precedent is tenancy.0001.
"""

import django.core.validators
import django.db.models.deletion
from decimal import Decimal
from django.conf import settings
from django.db import migrations, models

import pricing.models

MOVED = ("ratecard", "ratecardentry")


def move_content_types(from_label: str, to_label: str):
    def move(apps, schema_editor):
        content_type = apps.get_model("contenttypes", "ContentType")
        db = schema_editor.connection.alias
        taken = set(
            content_type.objects.using(db).filter(app_label=to_label, model__in=MOVED).values_list("model", flat=True)
        )
        # A model whose new content type exists already (a half-done earlier run) keeps it: renaming
        # would break the unique (app_label, model) pair.
        content_type.objects.using(db).filter(app_label=from_label, model__in=set(MOVED) - taken).update(
            app_label=to_label
        )

    return move


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("billing", "0014_spec_kind_mps"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='RateCard',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=100)),
                        ('currency', models.CharField(default=pricing.models.billing_currency, editable=False, max_length=3)),
                        ('effective_from', models.DateTimeField(help_text='UTC, on a whole hour.', unique=True)),
                        ('notes', models.TextField(blank=True)),
                        ('off_peak_start_hour', models.PositiveSmallIntegerField(blank=True, help_text='UTC hour off-peak starts; empty = none.', null=True, validators=[django.core.validators.MaxValueValidator(23)])),
                        ('off_peak_end_hour', models.PositiveSmallIntegerField(blank=True, help_text='UTC hour off-peak ends (exclusive).', null=True, validators=[django.core.validators.MaxValueValidator(23)])),
                        ('off_peak_multiplier', models.DecimalField(decimal_places=3, default=Decimal('1'), help_text='Every price x this in off-peak hours (0.6 = 40% off), so batch work moved there costs less.', max_digits=4, validators=[django.core.validators.MinValueValidator(Decimal('0.001'))])),
                        ('borrowed_multiplier', models.DecimalField(decimal_places=3, default=Decimal('0.5'), help_text='Best-effort rate of a borrowed (lent, preemptible) unit, as a fraction of its hourly price; the borrower pays it and the lender is credited the same.', max_digits=4, validators=[django.core.validators.MinValueValidator(Decimal('0')), django.core.validators.MaxValueValidator(Decimal('1'))])),
                        ('vgpu_licence_hourly', models.DecimalField(decimal_places=6, default=pricing.models.default_vgpu_licence, help_text='NVIDIA vGPU software licence per vGPU-hour, part of every vGPU price on this card (new cards start from BILLING_VGPU_LICENCE_HOURLY).', max_digits=12, validators=[django.core.validators.MinValueValidator(Decimal('0'))])),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('created_by', models.ForeignKey(blank=True, editable=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'billing_ratecard',
                        'ordering': ['-effective_from'],
                    },
                ),
                migrations.CreateModel(
                    name='RateCardEntry',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('full', 'Full GPU'), ('mig', 'MIG instance'), ('timeslice', 'Time-slice replica'), ('vgpu', 'vGPU (virtual machines)'), ('mps', 'MPS share')], max_length=16)),
                        ('product', models.CharField(help_text='Catalog key, e.g. H100-80GB.', max_length=32)),
                        ('profile_name', models.CharField(blank=True, help_text='MIG profile; empty otherwise.', max_length=32)),
                        ('replicas', models.PositiveSmallIntegerField(default=1, help_text='Time-slice replicas per GPU; 1 otherwise.')),
                        ('hourly_price', models.DecimalField(decimal_places=6, max_digits=12, validators=[django.core.validators.MinValueValidator(Decimal('0'))])),
                        ('is_override', models.BooleanField(default=False, help_text="Set by hand: kept when the card's full-GPU price is re-derived.")),
                        ('rule', models.CharField(blank=True, help_text='How the price was derived.', max_length=64)),
                        ('card', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='entries', to='pricing.ratecard')),
                    ],
                    options={
                        'verbose_name_plural': 'rate card entries',
                        'db_table': 'billing_ratecardentry',
                        'ordering': ['card_id', 'product', 'kind', 'profile_name', 'replicas'],
                        'constraints': [models.UniqueConstraint(fields=('card', 'kind', 'product', 'profile_name', 'replicas'), name='billing_ratecardentry_unique_spec'), models.CheckConstraint(condition=models.Q(('hourly_price__gte', 0)), name='billing_ratecardentry_price_not_negative'), models.CheckConstraint(condition=models.Q(('replicas__gte', 1)), name='billing_ratecardentry_replicas_positive')],
                    },
                ),
            ],
        ),
        migrations.RunPython(move_content_types("billing", "pricing"), move_content_types("pricing", "billing")),
    ]
