from django.apps import AppConfig


class QueueappConfig(AppConfig):
    name = "queueapp"
    verbose_name = "GPU queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from queueapp.dispatch import wakeup

        wakeup.connect_cluster_start()
