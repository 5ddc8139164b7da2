package main

import (
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// scheme knows the Deployment type the handler decodes.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := appsv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}
