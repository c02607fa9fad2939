from django.urls import path

from queueapp.live.consumers import QueueConsumer

websocket_urlpatterns = [path("ws/queue/", QueueConsumer.as_asgi())]
